//! The wasmtime runtime for processor components: one engine (pooling
//! allocator, copy-on-write memory, epoch interruption), components compiled
//! once per digest and cached on disk, an `InstancePre` per component, and a
//! fresh store per call with memory and time limits. Guests get WASI only,
//! with deterministic clocks and random, no filesystem, network or
//! environment; their stdout/stderr go to tracing.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::output::OutputPipe;
use anyhow::{Context as _, Result};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreLimits,
    StoreLimitsBuilder,
};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "stream-processor",
        // A storage failure traps (the wake is retried); the guest never
        // sees it as an error value it might swallow.
        imports: { default: trappable },
        with: {
            "wasi:keyvalue/store.bucket": super::BucketHandle,
        },
    });
}

/// The reactor's world: exports `reactor`, imports nothing of its own (a
/// component exporting both is linked as a processor is).
mod reactor_bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "stream-reactor",
    });
}

/// The worlds of `streamhost:processor@0.2.0` (`wit/0.2.0`, this crate's
/// copy), whose components the host still runs: their exports only (their
/// `wasi:keyvalue` imports are the current world's).
mod v2 {
    pub mod processor {
        wasmtime::component::bindgen!({
            path: "wit/0.2.0",
            world: "stream-processor",
            with: {
                "wasi:keyvalue/store": crate::runtime::bindings::wasi::keyvalue::store,
                "wasi:keyvalue/batch": crate::runtime::bindings::wasi::keyvalue::batch,
            },
        });
    }
    pub mod reactor {
        wasmtime::component::bindgen!({
            path: "wit/0.2.0",
            world: "stream-reactor",
        });
    }
}

use reactor_bindings::StreamReactorIndices;

use bindings::wasi::keyvalue::store::{Error as KvError, KeyResponse};
use wasmtime::component::Resource;

use super::keyed::{KeyedError, Session};

/// A guest's handle on its bucket (`open("")`); the bucket itself is the
/// store's [`Session`].
pub struct BucketHandle;

use bindings::exports::streamhost::processor::processor::Failure as FoldFailure;
pub use bindings::exports::streamhost::processor::processor::{
    Announcement, AppendEffect, Batch, Effect, EffectTarget, Folded, ItxEffect, StreamInfo,
    WebhookEffect,
};
use bindings::{StreamProcessorIndices, StreamProcessorPre};

/// The interface a processor component exports (this version; 0.2.0's runs too).
pub const PROCESSOR_INTERFACE: &str = "streamhost:processor/processor@0.3.0";
/// The interface a reactor component exports (this version; 0.2.0's runs too).
pub const REACTOR_INTERFACE: &str = "streamhost:processor/reactor@0.3.0";

/// A processor's exports, of the version it was built against.
enum ProcessorIndices {
    V2(v2::processor::StreamProcessorIndices),
    V3(StreamProcessorIndices),
}

/// A reactor's exports, of the version it was built against.
enum ReactorIndices {
    V2(v2::reactor::StreamReactorIndices),
    V3(StreamReactorIndices),
}

/// A processor's exports in one instance.
enum ProcessorExports {
    V2(v2::processor::StreamProcessor),
    V3(bindings::StreamProcessor),
}

/// The effects of either version and either interface, as this version's
/// processor effects (0.2.0's processor effects have no envelope and no
/// time; its reactor effects no time; only 0.3.0 has `cancel`).
macro_rules! effect_from {
    ($name:ident, $($m:ident)::+, |$e:ident| $type_:expr, $metadata:expr, $not_before:expr, $group:expr $(, $cancel:ident)?) => {
        fn $name($e: $($m)::+::Effect) -> Effect {
            use $($m)::+ as w;
            let target = match $e.target {
                w::EffectTarget::Append(a) => EffectTarget::Append(AppendEffect {
                    stream_path: a.stream_path,
                    type_: a.type_,
                    payload: a.payload,
                    metadata: a.metadata,
                }),
                w::EffectTarget::Webhook(h) => EffectTarget::Webhook(WebhookEffect {
                    url: h.url,
                    body: h.body,
                }),
                w::EffectTarget::Itx(x) => EffectTarget::Itx(ItxEffect {
                    expression: x.expression,
                    args: x.args,
                }),
                $(w::EffectTarget::$cancel(key) => EffectTarget::Cancel(key),)?
            };
            Effect {
                key: $e.key,
                target,
                not_before: $not_before,
                type_: $type_,
                metadata: $metadata,
                group: $group,
            }
        }
    };
}

effect_from!(
    reactor_effect,
    reactor_bindings::exports::streamhost::processor::reactor,
    |e| e.type_,
    e.metadata,
    e.not_before,
    e.group,
    Cancel
);
effect_from!(
    v2_reactor_effect,
    v2::reactor::exports::streamhost::processor::reactor,
    |e| e.type_,
    e.metadata,
    None,
    None
);
effect_from!(
    v2_processor_effect,
    v2::processor::exports::streamhost::processor::processor,
    |e| None,
    None,
    None,
    None
);
/// Linear memory a guest may use.
pub const GUEST_MEMORY_BYTES_MAX: usize = 256 * 1024 * 1024;
/// Virtual address space reserved per guest memory.
const MEMORY_RESERVATION_BYTES: u64 = 4 << 30;
/// Bytes of a slot's memory reset with `memset` (only the pages the last
/// guest dirtied, found with Linux's `PAGEMAP_SCAN`) instead of `madvise`.
const MEMORY_KEEP_RESIDENT_BYTES: usize = 2 * 1024 * 1024;
/// The same for tables.
const TABLE_KEEP_RESIDENT_BYTES: usize = 64 * 1024;
/// Freed pool slots that keep their resident pages for the next instance
/// of the same component (wasmtime's default is 100). Each keeps up to
/// [`MEMORY_KEEP_RESIDENT_BYTES`]: this bounds that memory (32 MiB) however
/// many slots traffic has touched; the rest are decommitted when freed.
const WARM_SLOTS_MAX: u32 = 16;
/// Epoch tick; call deadlines are counted in ticks.
const EPOCH_TICK_MS: u64 = 5;
/// A component whose instantiation took longer than this (ns) gets its
/// next instance made ahead of its next call ([`super::ahead`]): a
/// language runtime's (CPython's: milliseconds), not a Rust guest's
/// (tens of microseconds).
const AHEAD_INSTANTIATION_NS: u64 = 200_000;
/// The deadline of a processor's `describe` and `initial-state` calls after
/// its background compile (a guest's take milliseconds).
const FIRST_CALLS_TIMEOUT_MS: u64 = 1_000;
/// The deadline of an instance's making ahead (its start functions run).
const AHEAD_TIMEOUT_MS: u64 = 10_000;

/// Bytes of the guest's stderr a failure quotes (its last ones: a panic's
/// message is what a guest writes last).
pub const GUEST_STDERR_IN_FAILURE_BYTES: usize = 4096;

/// Why a guest call did not return a value.
#[derive(Debug, Clone, PartialEq)]
pub enum GuestError {
    /// The guest trapped: a panic, running out of memory or stack, or any
    /// other trap but the deadline's. A fold repeats it on every retry.
    Trap {
        /// wasmtime's account of the trap, its backtrace included.
        trap: String,
        /// What the guest wrote to stderr during the call (its last
        /// [`GUEST_STDERR_IN_FAILURE_BYTES`]).
        stderr: String,
    },
    /// The call ran past its deadline.
    Timeout { ms: u64, stderr: String },
    /// The host failed during the call (storage behind the keyed state, the
    /// instance pool): not the guest's doing, so worth retrying.
    Host(String),
    /// The guest returned `failure`.
    Failure { message: String, retryable: bool },
}

impl GuestError {
    /// Whether calling again may succeed: a trap repeats (the call is
    /// deterministic), a timeout or a host failure may not, and a guest's
    /// own failure says.
    pub fn retryable(&self) -> bool {
        match self {
            GuestError::Trap { .. } => false,
            GuestError::Timeout { .. } | GuestError::Host(_) => true,
            GuestError::Failure { retryable, .. } => *retryable,
        }
    }
}

/// ` (its stderr: ...)` when the guest wrote anything, or nothing.
fn quoting(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; the guest's stderr: {stderr}")
    }
}

impl std::fmt::Display for GuestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuestError::Trap { trap, stderr } if stderr.is_empty() => {
                write!(f, "the guest trapped: {trap}")
            }
            // The guest's own words first: a cap on the message keeps them.
            GuestError::Trap { trap, stderr } => {
                write!(f, "the guest trapped, writing to stderr: {stderr}\n{trap}")
            }
            GuestError::Timeout { ms, stderr } => {
                write!(f, "the guest timed out after {ms}ms{}", quoting(stderr))
            }
            GuestError::Host(m) => write!(f, "the host failed during the guest's call: {m}"),
            GuestError::Failure { message, .. } => write!(f, "the processor failed: {message}"),
        }
    }
}

/// One guest call's outcome: its result, the keyed session as the call
/// left it, the tail of what the guest wrote to stderr, and its first
/// lines of output.
struct Called<T> {
    result: Result<T, GuestError>,
    keyed: Option<Session>,
    stderr: String,
    /// The first [`OUTPUT_LINES_MAX`] lines, and how many more there were.
    lines: (Vec<OutputLine>, usize),
}

/// Lines of guest output an [`Output`] keeps at most; the rest are counted.
pub const OUTPUT_LINES_MAX: usize = 32;
/// Bytes of one guest output line an [`Output`] keeps (the rest is cut).
pub const OUTPUT_LINE_BYTES_MAX: usize = 1024;

/// One line a guest wrote: to `stdout` or `stderr`, when its call ended.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputLine {
    pub stream: &'static str,
    pub text: String,
    pub at: std::time::SystemTime,
}

/// The lines the guest calls of one piece of work (a wake) wrote, for its
/// span: the first [`OUTPUT_LINES_MAX`] (each cut at
/// [`OUTPUT_LINE_BYTES_MAX`] bytes); the others are counted.
#[derive(Debug, Default)]
pub struct Output {
    kept: Mutex<(Vec<OutputLine>, usize)>,
}

impl Output {
    fn add(&self, (lines, more): (Vec<OutputLine>, usize)) {
        if lines.is_empty() {
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let (lines_kept, dropped) = &mut *kept;
        *dropped += more;
        for line in lines {
            if lines_kept.len() < OUTPUT_LINES_MAX {
                lines_kept.push(line);
            } else {
                *dropped += 1;
            }
        }
    }

    /// The lines kept, and how many more there were.
    pub fn take(&self) -> (Vec<OutputLine>, usize) {
        std::mem::take(&mut *self.kept.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// `line` cut to [`OUTPUT_LINE_BYTES_MAX`] bytes (at a character boundary).
fn cut_line(line: &str) -> String {
    if line.len() <= OUTPUT_LINE_BYTES_MAX {
        return line.to_string();
    }
    let mut end = OUTPUT_LINE_BYTES_MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// A failure of the host inside a guest call (a keyed-state read, an
/// instance the pool could not give): reported as [`GuestError::Host`].
#[derive(Debug)]
struct HostFault(String);

impl std::fmt::Display for HostFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HostFault {}

/// An instantiation's error: a trap in the guest's start code stays a trap;
/// anything else is the host's (the instance pool is full).
fn instantiation_failed(e: wasmtime::Error) -> wasmtime::Error {
    if e.downcast_ref::<wasmtime::Trap>().is_some() {
        e
    } else {
        // Every cause (wasmtime's own text leaves an OS error out).
        let causes: Vec<String> = e.chain().map(ToString::to_string).collect();
        wasmtime::Error::new(HostFault(format!(
            "instantiating the component failed: {}",
            causes.join(": ")
        )))
    }
}

/// Instantiates `pre` in `store`, again (up to [`INSTANTIATE_TRIES`]
/// times in all) while it fails with a transient refusal of the kernel
/// ([`transient`]). No pause between tries: before it answers `EBUSY` the
/// kernel has already waited (tens of milliseconds) for the references to
/// go.
fn instantiate(
    pre: &wasmtime::component::InstancePre<GuestData>,
    store: &mut Store<GuestData>,
) -> wasmtime::Result<wasmtime::component::Instance> {
    let mut tries = 1;
    loop {
        match pre.instantiate(&mut *store) {
            Err(e) if tries < INSTANTIATE_TRIES && transient(&e) => {
                tracing::info!(error = %format!("{e:#}"), tries, "instantiating again");
                tries += 1;
            }
            result => return result.map_err(instantiation_failed),
        }
    }
}

/// Tries of one instantiation refused for a transient reason.
const INSTANTIATE_TRIES: u32 = 3;

/// Whether an instantiation failed for a reason that passes: the kernel
/// answered `EBUSY` (a component's first instance seals the memfd of its
/// memory image, which Linux refuses while another holds a reference to
/// one of its pages for a moment, as page migration and compaction do).
fn transient(e: &wasmtime::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ResourceBusy)
    })
}

/// The last [`GUEST_STDERR_IN_FAILURE_BYTES`] of `bytes`, as text, trimmed.
fn stderr_tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.len() <= GUEST_STDERR_IN_FAILURE_BYTES {
        return text.to_string();
    }
    let mut start = text.len() - GUEST_STDERR_IN_FAILURE_BYTES;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("… {}", &text[start..])
}

/// How a guest call's error is reported.
fn classify(e: wasmtime::Error, timeout_ms: u64, stderr: String) -> GuestError {
    if let Some(h) = e.downcast_ref::<HostFault>() {
        return GuestError::Host(h.0.clone());
    }
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => GuestError::Timeout {
            ms: timeout_ms,
            stderr,
        },
        _ => GuestError::Trap {
            trap: format!("{e:#}"),
            stderr,
        },
    }
}

/// The environment of one guest call, the one definition shared by the
/// wake, verify, backfill, refold and `streamhost fold`: what the wall clock
/// says, how the random bytes are seeded, and the hash seed; the monotonic
/// clock always reads 0. `witness` records whether the guest read the clock
/// or the random bytes, so a batch whose fold did can be folded again one
/// event at a time ([`Determinism::for_event`]), which makes its result
/// independent of where the wakes cut the batches.
#[derive(Debug, Clone, Default)]
pub struct Determinism {
    /// Wall-clock time the guest sees, ms since the epoch.
    pub wall_clock_ms: i64,
    /// Seed of the guest's random bytes.
    pub seed: [u8; 32],
    /// The insecure seed (hash map keys): one per stream, whatever the batch.
    pub hash_seed: u128,
    /// Set when the guest reads the wall clock or random bytes.
    pub witness: Witness,
}

/// Whether a guest read its clock or random bytes.
#[derive(Debug, Clone, Default)]
pub struct Witness(Arc<std::sync::atomic::AtomicBool>);

impl Witness {
    fn saw(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the guest read them.
    pub fn read(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

impl Determinism {
    /// The environment of folding one event: the clock reads the event's
    /// `createdAt`, the random bytes are seeded by (stream id, offset).
    pub fn for_event(stream_id: &str, offset: u64, created_at_ms: i64) -> Determinism {
        Determinism {
            wall_clock_ms: created_at_ms,
            seed: sha256(&[stream_id.as_bytes(), &offset.to_le_bytes()]),
            hash_seed: Self::hash_seed_of(stream_id),
            witness: Witness::default(),
        }
    }

    /// A given clock and seed (`streamhost fold --clock-ms --seed`).
    pub fn fixed(stream_id: &str, wall_clock_ms: i64, seed: [u8; 32]) -> Determinism {
        Determinism {
            wall_clock_ms,
            seed,
            hash_seed: Self::hash_seed_of(stream_id),
            witness: Witness::default(),
        }
    }

    fn hash_seed_of(stream_id: &str) -> u128 {
        let h = sha256(&[b"hash-seed", stream_id.as_bytes()]);
        u128::from_le_bytes(h[..16].try_into().expect("16 bytes"))
    }

    /// The seed as hex (for messages and `--seed`).
    pub fn seed_hex(&self) -> String {
        self.seed.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Parses a 64-hex-digit seed.
pub fn parse_seed(hex: &str) -> Result<[u8; 32], String> {
    let bad = || format!("seed {hex:?} is not 64 hexadecimal digits");
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut seed = [0u8; 32];
    for (i, byte) in seed.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(seed)
}

struct FixedWallClock(Duration, Witness);

impl HostWallClock for FixedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn now(&self) -> Duration {
        self.1.saw();
        self.0
    }
}

/// Deterministic random bytes that tell the witness they were read.
struct WitnessedRandom(wasmtime_wasi::Deterministic, Witness);

impl rand_core::TryRng for WitnessedRandom {
    type Error = std::convert::Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        self.1.saw();
        self.0.try_next_u32()
    }
    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        self.1.saw();
        self.0.try_next_u64()
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        self.1.saw();
        self.0.try_fill_bytes(dst)
    }
}

struct FixedMonotonicClock;

impl HostMonotonicClock for FixedMonotonicClock {
    fn resolution(&self) -> u64 {
        1_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// A store's limits, counting the linear memory of its instances (every
/// memory's size, summed: a component's core modules and adapters each
/// have one).
struct Limits {
    inner: StoreLimits,
    /// Bytes of linear memory now.
    memory: usize,
    /// The most `memory` has been.
    peak: usize,
}

impl wasmtime::ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.inner.memory_growing(current, desired, maximum)?;
        if allowed {
            self.memory = self.memory.saturating_add(desired.saturating_sub(current));
            self.peak = self.peak.max(self.memory);
        }
        Ok(allowed)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// The data of one guest store.
pub struct GuestData {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: Limits,
    /// The processor's bucket during a fold (`None`: no keyed state).
    keyed: Option<Session>,
    /// A long call's turn on the cores, on a lowered thread
    /// ([`set_deadline`], `turns.rs`).
    slices: super::turns::Slices,
}

/// A bucket operation's answer: refusals go to the guest as
/// `error::other`, storage failures trap.
fn kv<T>(r: Result<T, KeyedError>) -> wasmtime::Result<Result<T, KvError>> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(KeyedError::Refused(m)) => Ok(Err(KvError::Other(m))),
        Err(KeyedError::Storage(e)) => Err(wasmtime::Error::new(HostFault(format!(
            "reading the processor's keyed state failed: {e:#}"
        )))),
    }
}

impl GuestData {
    fn session(&mut self) -> Result<&mut Session, KeyedError> {
        self.keyed
            .as_mut()
            .ok_or_else(|| KeyedError::Refused("the keyed state is open only during fold".into()))
    }
}

impl bindings::wasi::keyvalue::store::Host for GuestData {
    fn open(
        &mut self,
        identifier: String,
    ) -> wasmtime::Result<Result<Resource<BucketHandle>, KvError>> {
        if !identifier.is_empty() {
            return Ok(Err(KvError::NoSuchStore));
        }
        if self.keyed.is_none() {
            return Ok(Err(KvError::AccessDenied));
        }
        Ok(Ok(self.table.push(BucketHandle)?))
    }
}

impl bindings::wasi::keyvalue::store::HostBucket for GuestData {
    fn get(
        &mut self,
        _: Resource<BucketHandle>,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, KvError>> {
        kv(self.session().and_then(|s| s.get(&key)))
    }

    fn set(
        &mut self,
        _: Resource<BucketHandle>,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), KvError>> {
        kv(self.session().and_then(|s| s.set(key, value)))
    }

    fn delete(
        &mut self,
        _: Resource<BucketHandle>,
        key: String,
    ) -> wasmtime::Result<Result<(), KvError>> {
        kv(self.session().and_then(|s| s.delete(key)))
    }

    fn exists(
        &mut self,
        _: Resource<BucketHandle>,
        key: String,
    ) -> wasmtime::Result<Result<bool, KvError>> {
        kv(self.session().and_then(|s| s.exists(&key)))
    }

    fn list_keys(
        &mut self,
        _: Resource<BucketHandle>,
        cursor: Option<u64>,
    ) -> wasmtime::Result<Result<KeyResponse, KvError>> {
        kv(self
            .session()
            .and_then(|s| s.list_keys(cursor))
            .map(|(keys, cursor)| KeyResponse { keys, cursor }))
    }

    fn drop(&mut self, bucket: Resource<BucketHandle>) -> wasmtime::Result<()> {
        self.table.delete(bucket)?;
        Ok(())
    }
}

impl bindings::wasi::keyvalue::batch::Host for GuestData {
    fn get_many(
        &mut self,
        _: Resource<BucketHandle>,
        keys: Vec<String>,
    ) -> wasmtime::Result<Result<Vec<Option<(String, Vec<u8>)>>, KvError>> {
        kv(self.session().and_then(|s| {
            let values = s.get_many(&keys)?;
            Ok(keys
                .into_iter()
                .zip(values)
                .map(|(k, v)| v.map(|v| (k, v)))
                .collect())
        }))
    }

    fn set_many(
        &mut self,
        _: Resource<BucketHandle>,
        key_values: Vec<(String, Vec<u8>)>,
    ) -> wasmtime::Result<Result<(), KvError>> {
        kv(self
            .session()
            .and_then(|s| key_values.into_iter().try_for_each(|(k, v)| s.set(k, v))))
    }

    fn delete_many(
        &mut self,
        _: Resource<BucketHandle>,
        keys: Vec<String>,
    ) -> wasmtime::Result<Result<(), KvError>> {
        kv(self
            .session()
            .and_then(|s| keys.into_iter().try_for_each(|k| s.delete(k))))
    }
}

impl WasiView for GuestData {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A compiled, linked component (a processor, or any ITX-callable one).
pub struct Prepared {
    pub digest: String,
    component: Component,
    instance_pre: wasmtime::component::InstancePre<GuestData>,
    /// Present when the component exports the processor interface.
    processor: Option<ProcessorIndices>,
    /// Present when the component exports the reactor interface.
    reactor: Option<ReactorIndices>,
    /// What its instantiation costs, and whether an instance of it may be
    /// made ahead of a call.
    instantiation: Arc<Instantiation>,
    announcement: OnceLock<Announcement>,
    /// Its `initial-state` (a call without input, in the default
    /// environment: the same answer every time).
    initial: OnceLock<String>,
    /// Its instances made ahead are parked under this key: its digest and
    /// a number of its own (an instance serves only the `Component` it was
    /// made from, not the same bytes loaded again after an eviction).
    ahead_key: String,
    /// Whether it imports `wasi:keyvalue` (keeps keyed state).
    keyed: bool,
}

impl Prepared {
    /// Whether the component imports `wasi:keyvalue`: its repro commands
    /// need the CLI's `-S keyvalue`.
    pub fn keyed(&self) -> bool {
        self.keyed
    }

    /// Whether the component exports the reactor interface.
    pub fn is_reactor(&self) -> bool {
        self.reactor.is_some()
    }
}

/// What instantiating a component costs, for [`Runtime::make_ahead`].
#[derive(Debug, Default)]
struct Instantiation {
    /// The last instantiation's time, ns.
    last_ns: std::sync::atomic::AtomicU64,
    /// Set when an instantiation read the clock or random bytes (a start
    /// function did): its instances are made at the call, with the call's
    /// environment, never ahead.
    reads_environment: std::sync::atomic::AtomicBool,
}

impl Instantiation {
    fn took(&self, elapsed: Duration) {
        self.last_ns.store(
            elapsed.as_nanos().min(u64::MAX as u128) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Whether a call's instance is worth making ahead.
    fn worth_ahead(&self) -> bool {
        !self
            .reads_environment
            .load(std::sync::atomic::Ordering::Relaxed)
            && self.last_ns.load(std::sync::atomic::Ordering::Relaxed) > AHEAD_INSTANTIATION_NS
    }
}

/// A number for each component loaded, unique in this process.
fn next_prepared_number() -> u64 {
    static LOADED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    LOADED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// An instance made ahead of a call ([`super::ahead`]): its store, and the
/// pipes its WASI context writes the guest's output to.
pub struct Made {
    store: Store<GuestData>,
    instance: wasmtime::component::Instance,
    stdout: OutputPipe,
    stderr: OutputPipe,
}

/// A fresh store for one call: `d`'s WASI context, the guest limits,
/// `timeout_ms` from now, the processor's bucket in `keyed`.
fn new_store(
    engine: &Engine,
    d: Determinism,
    timeout_ms: u64,
    keyed: Option<Session>,
) -> (Store<GuestData>, OutputPipe, OutputPipe) {
    let stdout = OutputPipe::default();
    let stderr = OutputPipe::default();
    let limits = Limits {
        inner: StoreLimitsBuilder::new()
            .memory_size(GUEST_MEMORY_BYTES_MAX)
            .trap_on_grow_failure(true)
            .build(),
        memory: 0,
        peak: 0,
    };
    let mut store = Store::new(
        engine,
        GuestData {
            wasi: wasi_ctx(&d, &stdout, &stderr),
            table: ResourceTable::new(),
            limits,
            keyed,
            slices: Default::default(),
        },
    );
    store.limiter(|g| &mut g.limits);
    store.epoch_deadline_trap();
    set_deadline(&mut store, timeout_ms);
    (store, stdout, stderr)
}

/// The call's deadline: `timeout_ms` from now. On a thread of lowered
/// priority (`SCHED_IDLE`: [`GuestThreads`]; a nice value of 10: the
/// background compiler's first calls), `timeout_ms` of the CPU time the
/// call gets: such a call waits while the cores are busy, and that wait
/// is not the guest's (a verify on a busy server would otherwise answer
/// "timed out" for a guest that never ran); it still ends after
/// [`IDLE_WAIT_FACTOR`] times `timeout_ms` in all.
///
/// Such a call also takes turns on the cores (`turns.rs`): past its first
/// [`SLICE_TICKS`] it runs only while it holds a turn (one per core), and
/// at each later slice hands it on if another call waits; the wait is not
/// its CPU time.
fn set_deadline(store: &mut Store<GuestData>, timeout_ms: u64) {
    let ticks = timeout_ms.div_ceil(EPOCH_TICK_MS).max(1);
    if !LOWERED_THREAD.with(std::cell::Cell::get) {
        store.set_epoch_deadline(ticks);
        store.epoch_deadline_trap();
        return;
    }
    store.set_epoch_deadline(ticks.min(SLICE_TICKS));
    let (cpu_start, started) = (thread_cpu_ms(), std::time::Instant::now());
    let wall_max = Duration::from_millis(timeout_ms.saturating_mul(IDLE_WAIT_FACTOR));
    store.epoch_deadline_callback(move |mut cx| {
        let used = thread_cpu_ms().saturating_sub(cpu_start);
        if used < timeout_ms && started.elapsed() < wall_max {
            cx.data_mut().slices.sliced();
            let left = (timeout_ms - used).div_ceil(EPOCH_TICK_MS).max(1);
            Ok(wasmtime::UpdateDeadline::Continue(left.min(SLICE_TICKS)))
        } else {
            Err(wasmtime::Trap::Interrupt.into())
        }
    });
}

/// A long call's time slice on a lowered thread, in epoch ticks (10 ms).
const SLICE_TICKS: u64 = 2;

/// A call on a thread of lowered priority ends after this many times its
/// timeout, however little CPU it got.
const IDLE_WAIT_FACTOR: u64 = 10;

thread_local! {
    /// Whether this thread runs below the normal priority
    /// ([`idle_this_thread`], [`lower_this_threads_priority`]): its guest
    /// calls' deadlines count the CPU time they get.
    static LOWERED_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The CPU time the calling thread has used, in milliseconds.
fn thread_cpu_ms() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a plain system call writing into a timespec that lives
        // across it.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000;
        }
    }
    0
}

/// The WASI context of a call: `d`'s clocks and random, output to the pipes.
fn wasi_ctx(d: &Determinism, stdout: &OutputPipe, stderr: &OutputPipe) -> WasiCtx {
    WasiCtx::builder()
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .wall_clock(FixedWallClock(
            Duration::from_millis(d.wall_clock_ms.max(0) as u64),
            d.witness.clone(),
        ))
        .monotonic_clock(FixedMonotonicClock)
        .secure_random(WitnessedRandom(
            wasmtime_wasi::Deterministic::new(d.seed.to_vec()),
            d.witness.clone(),
        ))
        .insecure_random(WitnessedRandom(
            wasmtime_wasi::Deterministic::new(d.seed.iter().rev().copied().collect()),
            d.witness.clone(),
        ))
        .insecure_random_seed(d.hash_seed)
        .build()
}

/// Why a dynamic (ITX) call did not return a value.
#[derive(Debug, Clone, PartialEq)]
pub enum CallError {
    /// No exported function of that name.
    NoSuchFunction(String),
    /// An argument does not fit its WIT type.
    Argument(crate::value::Mismatch),
    /// The guest trapped or timed out.
    Guest(GuestError),
    /// The function returned `result::err`; the error value as JSON.
    Err(serde_json::Value),
}

/// The engine settings every guest runs with (public so the processor
/// benchmark's raw-wasmtime floor runs with the same ones): epoch
/// interruption, a 1 MiB wasm stack, 4 GiB memory reservations (virtual, no
/// commit: cranelift elides bounds checks; the store limiter caps what a
/// guest may actually use) and the pooling allocator.
pub fn engine_config() -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.max_wasm_stack(1024 * 1024);
    config.memory_reservation(MEMORY_RESERVATION_BYTES);
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(200)
        .total_core_instances(400)
        .total_memories(400)
        .total_tables(400)
        .max_memory_size(MEMORY_RESERVATION_BYTES as usize)
        .linear_memory_keep_resident(MEMORY_KEEP_RESIDENT_BYTES)
        .table_keep_resident(TABLE_KEEP_RESIDENT_BYTES)
        .max_unused_warm_slots(WARM_SLOTS_MAX)
        .pagemap_scan(wasmtime::Enabled::Auto);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

/// The threads Cranelift compiles on: wasmtime compiles a component's
/// functions in parallel on the rayon pool it is called in, and this one's
/// threads run at a nice value of 10, so a deploy's seconds of compiling
/// take the CPU that appends, reads and wakes leave idle. A pool of its
/// own: an embedder's use of rayon's global pool is left as it is. `None`
/// (no threads to be had): compiles run on the global pool.
fn compile_pool() -> Option<rayon::ThreadPool> {
    let built = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("streamhost-cranelift-{i}"))
        .start_handler(|_| lower_this_threads_priority())
        .build();
    match built {
        Ok(pool) => Some(pool),
        Err(e) => {
            tracing::warn!(error = %e, "compiling on rayon's global pool");
            None
        }
    }
}

/// Sets the calling thread's nice value to 10 (Linux: per thread). A
/// thread cannot raise it again unprivileged, so only threads that do
/// nothing else are lowered.
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on the calling thread's id; no memory is passed.
    unsafe {
        let tid = libc::gettid();
        if libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10) == 0 {
            LOWERED_THREAD.with(|lowered| lowered.set(true));
        }
    }
}

/// `SCHED_IDLE` for the calling thread (Linux): it runs on CPU time no
/// other thread wants, and any other thread that wakes preempts it at once
/// (a nice value only weighs its share: a woken request could still wait
/// for a busy guest's time slice).
fn idle_this_thread() {
    #[cfg(target_os = "linux")]
    // SAFETY: a plain system call on the calling thread (pid 0), with a
    // parameter that lives across it.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0 {
            LOWERED_THREAD.with(|lowered| lowered.set(true));
        }
    }
}

/// Compiled functions on disk, keyed by what Cranelift compiled (its
/// incremental cache): a file per function under two levels of
/// directories, written whole, then renamed. A read or write that fails
/// only costs a compile.
#[derive(Debug)]
struct FunctionCache {
    dir: PathBuf,
}

impl FunctionCache {
    fn new(dir: PathBuf) -> FunctionCache {
        FunctionCache { dir }
    }

    fn path(&self, key: &[u8]) -> PathBuf {
        use sha2::Digest;
        let name: String = sha2::Sha256::digest(key)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.dir.join(&name[..2]).join(&name[2..])
    }
}

impl wasmtime::CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<std::borrow::Cow<'_, [u8]>> {
        std::fs::read(self.path(key))
            .ok()
            .map(std::borrow::Cow::Owned)
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let path = self.path(key);
        let Some(parent) = path.parent() else {
            return false;
        };
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::create_dir_all(parent).is_ok()
            && std::fs::write(&tmp, value).is_ok()
            && std::fs::rename(&tmp, &path).is_ok()
    }
}

/// How the background compiler reads a queued component's bytes.
type BytesOf = Box<dyn FnOnce() -> Result<Vec<u8>> + Send>;

/// The runtime. Cheap to share (`Arc`).
pub struct Runtime {
    engine: Engine,
    linker: Linker<GuestData>,
    cache_dir: PathBuf,
    prepared: Mutex<super::cache::Lru<String, Arc<Prepared>>>,
    /// The digests being compiled now, each with the lock its compile
    /// holds: a second `prepare` of the same digest waits for the first
    /// instead of compiling again beside it.
    compiling: Mutex<std::collections::HashMap<String, Arc<Mutex<()>>>>,
    /// The background compiler's queue (its thread starts with the first
    /// [`Runtime::compile_in_background`]).
    background: Mutex<Option<std::sync::mpsc::Sender<(String, BytesOf)>>>,
    /// Counts the compiles that ended, for [`Runtime::compiled`].
    compiles_ended: tokio::sync::watch::Sender<u64>,
    /// Where compiles run ([`compile_pool`]).
    compile_pool: Option<rayon::ThreadPool>,
    /// The digest each component (project, name) ran last on this host.
    current: Mutex<std::collections::HashMap<(String, String), String>>,
    compatibility: String,
    /// The most linear memory one call's instance has had.
    largest_guest_memory: std::sync::atomic::AtomicUsize,
    /// Instances made ahead of their calls.
    ahead: Arc<super::ahead::Ahead<Made>>,
    /// Where guest code a request asks for runs ([`GuestThreads`]).
    guest_threads: GuestThreads,
}

/// The threads that run guest code a request asks for (ITX calls, a
/// processor's state at an offset, verifies, backfills): a blocking pool of
/// its own whose threads run under `SCHED_IDLE` ([`idle_this_thread`]). A
/// guest that spins until its timeout takes only the CPU that requests,
/// appends, commits and the pipeline leave idle: one project's calls at its
/// share of places cost another project's appends nothing measurable even
/// on two cores (at a nice value of 10 the woken requests still waited for
/// busy guests' time slices: p99 4x). On a server whose other threads keep
/// every core busy these calls wait; their timeout counts the CPU time
/// they get (`set_deadline`), up to ten times the timeout in all, and past
/// their first slice they take turns on the cores (`turns.rs`: no more of
/// them runnable than there are cores). The
/// pipeline's guest work stays on the common pool at the normal priority:
/// a wake commits its checkpoint on its own thread (at a low priority it
/// would hold the writer behind busy guests), and wakes, ITX deliveries,
/// refolds and shadow steps are bounded by their retries and places, not
/// starved by load.
struct GuestThreads {
    /// A tokio runtime used only for its blocking pool; `None` when it
    /// could not be built (calls then run on the caller's blocking pool).
    pool: Option<tokio::runtime::Runtime>,
}

impl GuestThreads {
    fn new() -> GuestThreads {
        let built = tokio::runtime::Builder::new_current_thread()
            .thread_name("streamhost-guest")
            .max_blocking_threads(GUEST_THREADS_MAX)
            .on_thread_start(idle_this_thread)
            .build();
        match built {
            Ok(pool) => GuestThreads { pool: Some(pool) },
            Err(e) => {
                tracing::warn!(error = %e, "guest calls run on the common blocking pool");
                GuestThreads { pool: None }
            }
        }
    }

    fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        match &self.pool {
            Some(pool) => pool.spawn_blocking(f),
            None => tokio::task::spawn_blocking(f),
        }
    }
}

impl Drop for GuestThreads {
    fn drop(&mut self) {
        // Dropped from async code too (a host closed in a task): the pool's
        // threads are let go without waiting for them.
        if let Some(pool) = self.pool.take() {
            pool.shutdown_background();
        }
    }
}

/// Threads of [`GuestThreads`] at most (as tokio's own blocking pool); the
/// guest calls' places (`[processors] max-concurrent-calls`) bound them
/// first.
const GUEST_THREADS_MAX: usize = 512;

impl Runtime {
    /// Builds the engine and starts its epoch ticker. `cache_dir` holds
    /// compiled components; at most [`super::cache::PREPARED_BYTES_MAX`]
    /// bytes of compiled code stay in memory.
    pub fn new(cache_dir: PathBuf) -> Result<Arc<Runtime>> {
        Self::with_compiled_code_bytes(cache_dir, super::cache::PREPARED_BYTES_MAX)
    }

    /// [`Runtime::new`] keeping at most `compiled_code_bytes` of compiled
    /// code in memory (the least recently used components' go first; the
    /// component in use is kept even when it alone is larger).
    pub fn with_compiled_code_bytes(
        cache_dir: PathBuf,
        compiled_code_bytes: usize,
    ) -> Result<Arc<Runtime>> {
        let mut config = engine_config();
        // Functions compiled for one component serve every other that
        // holds the same function: components built with the same language
        // runtime (SpiderMonkey, CPython) share most of their code.
        config
            .enable_incremental_compilation(Arc::new(FunctionCache::new(
                cache_dir.join("functions"),
            )))
            .map_err(anyhow::Error::from)
            .context("enabling the compiled-function cache")?;
        let engine = Engine::new(&config)
            .map_err(anyhow::Error::from)
            .context("creating the wasm engine")?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(anyhow::Error::from)
            .context("linking WASI")?;
        bindings::wasi::keyvalue::store::add_to_linker::<_, wasmtime::component::HasSelf<GuestData>>(
            &mut linker,
            |d| d,
        )
        .map_err(anyhow::Error::from)
        .context("linking wasi:keyvalue/store")?;
        bindings::wasi::keyvalue::batch::add_to_linker::<_, wasmtime::component::HasSelf<GuestData>>(
            &mut linker,
            |d| d,
        )
        .map_err(anyhow::Error::from)
        .context("linking wasi:keyvalue/batch")?;
        // A stable key (sha256), unlike `DefaultHasher`, whose output may
        // change between Rust releases.
        let mut hasher = Sha256Hasher(sha2::Sha256::default());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let compatibility = hasher.hex16();
        std::fs::create_dir_all(&cache_dir)
            .with_context(|| format!("creating {}", cache_dir.display()))?;
        let ticker = engine.weak();
        std::thread::Builder::new()
            .name("streamhost-epoch".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(EPOCH_TICK_MS));
                match ticker.upgrade() {
                    Some(e) => e.increment_epoch(),
                    None => return,
                }
            })
            .context("starting the epoch ticker")?;
        Ok(Arc::new(Runtime {
            engine,
            linker,
            cache_dir,
            prepared: Mutex::new(super::cache::Lru::new(
                super::cache::PREPARED_COMPONENTS_MAX,
                compiled_code_bytes,
            )),
            compiling: Mutex::new(std::collections::HashMap::new()),
            background: Mutex::new(None),
            compiles_ended: tokio::sync::watch::Sender::new(0),
            compile_pool: compile_pool(),
            current: Mutex::new(std::collections::HashMap::new()),
            compatibility,
            largest_guest_memory: std::sync::atomic::AtomicUsize::new(0),
            ahead: super::ahead::Ahead::new(lower_this_threads_priority),
            guest_threads: GuestThreads::new(),
        }))
    }

    /// Runs `f`, guest code a request asks for, on a thread of the
    /// runtime's guest pool (see `GuestThreads`): on CPU time that
    /// requests, appends and commits leave idle. Awaited from any runtime;
    /// a panic in `f` is the handle's error.
    pub fn run_guest<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        self.guest_threads.spawn(f)
    }

    /// The most linear memory (bytes, every memory of the instance summed)
    /// that one call's instance has had since this runtime started: what a
    /// guest costs per instance, beside [`GUEST_MEMORY_BYTES_MAX`].
    pub fn largest_guest_memory(&self) -> usize {
        self.largest_guest_memory
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Instances made ahead of their calls: how many are parked now, and
    /// how many calls such an instance has served.
    pub fn instances_made_ahead(&self) -> (usize, u64) {
        (self.ahead.parked(), self.ahead.served())
    }

    /// Waits until `holds` (of [`Runtime::instances_made_ahead`]), asked
    /// again as each making ahead ends, for at most `within`; answers
    /// whether it holds.
    pub fn wait_for_instances_made_ahead(
        &self,
        within: Duration,
        holds: impl Fn((usize, u64)) -> bool,
    ) -> bool {
        self.ahead
            .wait_for(within, || holds(self.instances_made_ahead()))
    }

    /// The compiled components held in memory: how many, and their bytes
    /// of compiled code.
    pub fn compiled_in_memory(&self) -> (usize, usize) {
        let prepared = self.prepared.lock().expect("prepared");
        (prepared.len(), prepared.bytes())
    }

    /// Compiles `bytes`, checks that it is a component that links with WASI
    /// alone and exports functions; returns the exported function names and
    /// whether it is a processor. The compiled form is kept in the disk
    /// cache, so the first `prepare` of the same bytes does not compile
    /// again.
    pub fn validate(&self, bytes: &[u8]) -> Result<(Vec<String>, bool), String> {
        refuse_from_names(bytes)?;
        // These bytes compiled before (their digest names the cached form,
        // which is checked before it is loaded): valid, and not compiled
        // again.
        let path = self.cache_path(&digest(bytes));
        let cached = self.load_cached(&path);
        let fresh = cached.is_none();
        let component = match cached {
            Some(c) => c,
            None => self.compile(bytes).map_err(|e| {
                format!(
                    "the body is not a valid WebAssembly component: {}",
                    root_cause(&e)
                )
            })?,
        };
        let exports = exported_functions(&self.engine, &component);
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            format!(
                "the component cannot be linked (guests may import only WASI): {}",
                root_cause(&e)
            )
        })?;
        let processor = StreamProcessorPre::new(pre).is_ok();
        if exports.is_empty() {
            return Err(no_exports());
        }
        // Its compiled form, for the first `prepare` of these bytes: a
        // deploy and its first wake (or an offline fold) compile once.
        if fresh {
            self.cache_compiled(&path, &component);
        }
        Ok((exports, processor))
    }

    /// What a deploy checks before it answers, without compiling: that
    /// `bytes` are a component that validates (every function body), asks
    /// only for what the host gives, was built against this host's `wit/`
    /// and exports functions; answers their names. Compiling is left to
    /// [`Runtime::compile_in_background`] or the first [`Runtime::prepare`].
    pub fn check(&self, bytes: &[u8]) -> Result<Vec<String>, String> {
        refuse_from_names(bytes)?;
        let exports = super::contract::exported_functions(bytes)
            .map_err(|e| format!("the body is not a valid WebAssembly component: {e}"))?;
        if exports.is_empty() {
            return Err(no_exports());
        }
        Ok(exports)
    }

    /// Queues the compile of `digest` (its bytes read by `bytes` when its
    /// turn comes) for the background compiler, unless it is compiled
    /// already or being compiled: a deploy answers at once, and its first
    /// wake or call waits for this compile instead of starting another.
    /// One thread compiles one component at a time, in order, below
    /// requests' priority, so a burst of deploys queues digests, not
    /// threads, bytes or compiles' memory. A failure is logged; the first
    /// use compiles again and reports it.
    pub fn compile_in_background(
        self: &Arc<Self>,
        digest: &str,
        bytes: impl FnOnce() -> Result<Vec<u8>> + Send + 'static,
    ) {
        if self.is_compiled(digest) || self.is_compiling(digest) {
            return;
        }
        // Registered now: from here on the digest is compiling, and a
        // delivery of it waits (`Runtime::compiled`).
        let lock = self.compile_lock(digest);
        let mut queue = self.background.lock().expect("background");
        if queue.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<(String, BytesOf)>();
            let runtime = Arc::downgrade(self);
            let spawned = std::thread::Builder::new()
                .name("streamhost-compile".into())
                .spawn(move || {
                    lower_this_threads_priority();
                    while let Ok((digest, bytes)) = rx.recv() {
                        let Some(runtime) = runtime.upgrade() else {
                            return;
                        };
                        runtime.compile_queued(&digest, bytes);
                    }
                });
            match spawned {
                Ok(_) => *queue = Some(tx),
                Err(e) => {
                    tracing::warn!(error = %e, "no thread to compile on: the first use compiles");
                    drop(queue);
                    self.compile_done(digest, &lock);
                    return;
                }
            }
        }
        let sent = queue
            .as_ref()
            .map(|tx| tx.send((digest.to_string(), Box::new(bytes))).is_ok());
        if sent != Some(true) {
            *queue = None;
            drop(queue);
            self.compile_done(digest, &lock);
        }
    }

    /// The background compiler's turn for `digest`.
    fn compile_queued(&self, digest: &str, bytes: BytesOf) {
        let started = std::time::Instant::now();
        // What its first wake asks before folding (a processor's
        // announcement and initial state, each the same every time), then
        // an instance for that fold (a large one faults its memory image
        // in): the first wake after the deploy costs what a steady one
        // does. The compile counts as ended only after these calls, so a
        // wake waiting for it finds their answers instead of racing them
        // with its own deadline (which would then count the first
        // instantiation). On this thread of lowered priority their
        // deadlines count the CPU time they get. A guest that fails or
        // takes too long here meets its first wake as it is.
        let first_calls = |p: &Arc<Prepared>| {
            tracing::info!(
                %digest,
                ms = started.elapsed().as_millis() as u64,
                "component compiled"
            );
            if p.processor.is_some() {
                let _ = self.describe(digest, p, FIRST_CALLS_TIMEOUT_MS);
                let _ = self.initial_state(digest, p, FIRST_CALLS_TIMEOUT_MS);
            }
            self.make_ahead(p, true);
        };
        if let Err(e) = self.prepare_once_then(digest, bytes, first_calls) {
            tracing::warn!(%digest, error = %format!("{e:#}"), "compiling the component failed")
        }
    }

    /// Compiles `bytes` on the compile pool (at its lower priority).
    fn compile(&self, bytes: &[u8]) -> wasmtime::Result<Component> {
        match &self.compile_pool {
            Some(pool) => pool.install(|| Component::new(&self.engine, bytes)),
            None => Component::new(&self.engine, bytes),
        }
    }

    /// Whether the component of `digest` is compiled on this host (in
    /// memory or in the disk cache).
    pub fn is_compiled(&self, digest: &str) -> bool {
        self.prepared
            .lock()
            .expect("prepared")
            .contains(&digest.to_string())
            || self.cache_path(digest).exists()
    }

    /// Whether the component of `digest` is being compiled now.
    pub fn is_compiling(&self, digest: &str) -> bool {
        self.compiling
            .lock()
            .expect("compiling")
            .contains_key(digest)
    }

    /// Records that component `name` of `project` runs `digest` (the
    /// deployed version a wake or call just prepared).
    pub fn note_current(&self, project: &str, name: &str, digest: &str) {
        let mut current = self.current.lock().expect("current");
        let key = (project.to_string(), name.to_string());
        if current.get(&key).is_none_or(|d| d != digest) {
            current.insert(key, digest.to_string());
        }
    }

    /// Whether the version component `name` of `project` ran last on this
    /// host is prepared in memory, with nothing compiling: then its next
    /// wake or call is not expected to compile (cheap: no storage read).
    pub fn ready(&self, project: &str, name: &str) -> bool {
        if self.any_compiling() {
            return false;
        }
        let current = self.current.lock().expect("current");
        let Some(digest) = current.get(&(project.to_string(), name.to_string())) else {
            return false;
        };
        self.prepared.lock().expect("prepared").contains(digest)
    }

    /// Whether any component is being compiled now (cheap: a wake asks it
    /// before it looks up which version it runs).
    pub fn any_compiling(&self) -> bool {
        !self.compiling.lock().expect("compiling").is_empty()
    }

    /// Waits until the component of `digest` is not being compiled.
    pub async fn compiled(&self, digest: &str) {
        loop {
            let mut ended = self.compiles_ended.subscribe();
            if !self.is_compiling(digest) {
                return;
            }
            if ended.changed().await.is_err() {
                return;
            }
        }
    }

    /// The lock of `digest`'s compile, registering one if none is.
    fn compile_lock(&self, digest: &str) -> Arc<Mutex<()>> {
        self.compiling
            .lock()
            .expect("compiling")
            .entry(digest.to_string())
            .or_default()
            .clone()
    }

    /// Forgets `digest`'s compile lock (if it is still `lock`).
    fn compile_done(&self, digest: &str, lock: &Arc<Mutex<()>>) {
        let mut compiling = self.compiling.lock().expect("compiling");
        if compiling.get(digest).is_some_and(|l| Arc::ptr_eq(l, lock)) {
            compiling.remove(digest);
        }
        drop(compiling);
        self.compiles_ended.send_modify(|n| *n += 1);
    }

    /// The compiled component cached at `path`, if one is there and passes
    /// its checks (anything else is compiled again, never loaded).
    fn load_cached(&self, path: &std::path::Path) -> Option<Component> {
        match super::compiled::read(path, &self.compatibility) {
            Ok(Some(Ok(payload))) => {
                // SAFETY: the payload is byte for byte what
                // `Component::serialize` of this engine configuration wrote
                // (its length and SHA-256 are checked against the header,
                // which names this engine); wasmtime checks its own header
                // again.
                match unsafe { Component::deserialize(&self.engine, &payload) } {
                    Ok(c) => Some(c),
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %root_cause(&e), "compiled component refused; compiling again");
                        None
                    }
                }
            }
            Ok(Some(Err(defect))) => {
                tracing::warn!(path = %path.display(), %defect, "compiled component not loaded; compiling again");
                None
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "compiled component unreadable; compiling again");
                None
            }
        }
    }

    /// Writes `component`'s compiled form to `path` (best effort: a
    /// failure only costs a compile later).
    fn cache_compiled(&self, path: &std::path::Path, component: &Component) {
        if let Ok(serialized) = component.serialize() {
            if let Err(e) = super::compiled::write(path, &self.compatibility, &serialized) {
                tracing::warn!(path = %path.display(), error = %e, "compiled component not cached");
            }
        }
    }

    fn cache_path(&self, digest: &str) -> PathBuf {
        self.cache_dir
            .join(format!("{digest}-{}.cwasm", self.compatibility))
    }

    /// The prepared component of `digest`, compiling `bytes()` on first use
    /// (or loading the compiled form from the disk cache).
    pub fn prepare(
        &self,
        digest: &str,
        bytes: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<Arc<Prepared>> {
        match self.in_memory(digest) {
            Some(p) => Ok(p),
            None => self.prepare_once(digest, bytes),
        }
    }

    /// The prepared component of `digest` held in memory (marked as just
    /// used).
    fn in_memory(&self, digest: &str) -> Option<Arc<Prepared>> {
        self.prepared
            .lock()
            .expect("prepared")
            .get(&digest.to_string())
    }

    /// [`Runtime::prepare`] under `digest`'s compile lock: one compile per
    /// digest at a time; whoever comes second waits for the first and then
    /// finds its result. The lock is forgotten after, whatever happened.
    fn prepare_once(
        &self,
        digest: &str,
        bytes: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<Arc<Prepared>> {
        self.prepare_once_then(digest, bytes, |_| {})
    }

    /// [`Runtime::prepare_once`], running `then` on the prepared
    /// component before its compile counts as ended.
    fn prepare_once_then(
        &self,
        digest: &str,
        bytes: impl FnOnce() -> Result<Vec<u8>>,
        then: impl FnOnce(&Arc<Prepared>),
    ) -> Result<Arc<Prepared>> {
        let lock = self.compile_lock(digest);
        let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        let prepared = match self.in_memory(digest) {
            Some(p) => Ok(p),
            None => self.prepare_locked(digest, bytes),
        };
        drop(guard);
        if let Ok(p) = &prepared {
            then(p);
        }
        self.compile_done(digest, &lock);
        prepared
    }

    /// Loads or compiles `digest` (its compile lock held).
    fn prepare_locked(
        &self,
        digest: &str,
        bytes: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<Arc<Prepared>> {
        let path = self.cache_path(digest);
        let component = match self.load_cached(&path) {
            Some(c) => c,
            None => {
                let bytes = bytes()?;
                let c = self
                    .compile(&bytes)
                    .map_err(anyhow::Error::from)
                    .context("compiling the component")?;
                self.cache_compiled(&path, &c);
                c
            }
        };
        let instance_pre = self.linker.instantiate_pre(&component)?;
        let processor = StreamProcessorIndices::new(&instance_pre)
            .map(ProcessorIndices::V3)
            .or_else(|_| {
                v2::processor::StreamProcessorIndices::new(&instance_pre).map(ProcessorIndices::V2)
            })
            .ok();
        let reactor = StreamReactorIndices::new(&instance_pre)
            .map(ReactorIndices::V3)
            .or_else(|_| {
                v2::reactor::StreamReactorIndices::new(&instance_pre).map(ReactorIndices::V2)
            })
            .ok();
        let keyed = component
            .component_type()
            .imports(&self.engine)
            .any(|(name, _)| name.starts_with("wasi:keyvalue/"));
        let prepared = Arc::new(Prepared {
            digest: digest.to_string(),
            component,
            instance_pre,
            processor,
            reactor,
            instantiation: Arc::default(),
            announcement: OnceLock::new(),
            initial: OnceLock::new(),
            ahead_key: format!("{digest} {}", next_prepared_number()),
            keyed,
        });
        // Instances made ahead from an earlier load of these bytes serve
        // no call of this one.
        let loaded = format!("{digest} ");
        self.ahead
            .forget(|key| key.starts_with(&loaded) && key != prepared.ahead_key);
        let range = prepared.component.image_range();
        let bytes = (range.end as usize).saturating_sub(range.start as usize);
        self.prepared
            .lock()
            .expect("prepared")
            .insert(digest.to_string(), prepared.clone(), bytes);
        Ok(prepared)
    }

    /// Runs `f` with a fresh instance of `p`: the one made ahead for it if
    /// one is parked (given `d`, `keyed` and the deadline now), else one
    /// made here; then has the next one made ahead when instantiating `p`
    /// is worth it ([`Runtime::make_ahead`]).
    fn run_instance<T>(
        &self,
        name: &str,
        p: &Prepared,
        d: Determinism,
        timeout_ms: u64,
        keyed: Option<Session>,
        f: impl FnOnce(&mut Store<GuestData>, &wasmtime::component::Instance) -> wasmtime::Result<T>,
    ) -> Called<T> {
        let (mut store, stdout, stderr, instance) = match self.ahead.take(&p.ahead_key) {
            Some(Made {
                mut store,
                instance,
                stdout,
                stderr,
            }) => {
                let data = store.data_mut();
                data.wasi = wasi_ctx(&d, &stdout, &stderr);
                data.keyed = keyed;
                set_deadline(&mut store, timeout_ms);
                (store, stdout, stderr, Ok(instance))
            }
            None => {
                let (mut store, stdout, stderr) = new_store(&self.engine, d, timeout_ms, keyed);
                let started = std::time::Instant::now();
                let instance = instantiate(&p.instance_pre, &mut store);
                p.instantiation.took(started.elapsed());
                (store, stdout, stderr, instance)
            }
        };
        let result = instance.and_then(|i| f(&mut store, &i));
        let called = self.finish(name, &mut store, &stdout, &stderr, result, timeout_ms);
        drop(store);
        self.make_ahead(p, false);
        called
    }

    /// Has an instance of `p` made ahead of its next call (`first`: its
    /// first instance after a compile, whatever it costs; otherwise only
    /// when its last instantiation took more than
    /// [`AHEAD_INSTANTIATION_NS`]). Made with a placeholder environment:
    /// one whose making read the clock or random bytes is dropped, and no
    /// instance of `p` is made ahead again.
    fn make_ahead(&self, p: &Prepared, first: bool) {
        if !first && !p.instantiation.worth_ahead() {
            return;
        }
        let engine = self.engine.clone();
        let pre = p.instance_pre.clone();
        let instantiation = p.instantiation.clone();
        self.ahead.request(&p.ahead_key, move || {
            let placeholder = Determinism::default();
            let witness = placeholder.witness.clone();
            let (mut store, stdout, stderr) =
                new_store(&engine, placeholder, AHEAD_TIMEOUT_MS, None);
            let started = std::time::Instant::now();
            let instance = pre.instantiate(&mut store).ok()?;
            instantiation.took(started.elapsed());
            if witness.read() {
                instantiation
                    .reads_environment
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                return None;
            }
            Some(Made {
                store,
                instance,
                stdout,
                stderr,
            })
        });
    }

    /// Logs a call's output, notes its memory; answers its result.
    fn finish<T>(
        &self,
        name: &str,
        store: &mut Store<GuestData>,
        stdout: &OutputPipe,
        stderr: &OutputPipe,
        result: wasmtime::Result<T>,
        timeout_ms: u64,
    ) -> Called<T> {
        self.largest_guest_memory.fetch_max(
            store.data().limits.peak,
            std::sync::atomic::Ordering::Relaxed,
        );
        let keyed = store.data_mut().keyed.take();
        let (mut lines, mut more) = (Vec::new(), 0);
        let at = std::time::SystemTime::now();
        for (stream, pipe) in [("stdout", stdout), ("stderr", stderr)] {
            let bytes = pipe.contents();
            for line in String::from_utf8_lossy(&bytes)
                .lines()
                .filter(|l| !l.is_empty())
            {
                if result.is_ok() {
                    tracing::info!(processor = name, stream, "{line}");
                } else {
                    tracing::warn!(processor = name, stream, "{line}");
                }
                if lines.len() < OUTPUT_LINES_MAX {
                    lines.push(OutputLine {
                        stream,
                        text: cut_line(line),
                        at,
                    });
                } else {
                    more += 1;
                }
            }
        }
        let stderr = stderr_tail(&stderr.contents());
        Called {
            result: result.map_err(|e| classify(e, timeout_ms, stderr.clone())),
            keyed,
            stderr,
            lines: (lines, more),
        }
    }

    fn call<T>(
        &self,
        name: &str,
        p: &Prepared,
        d: Determinism,
        timeout_ms: u64,
        f: impl FnOnce(&mut Store<GuestData>, &ProcessorExports) -> wasmtime::Result<T>,
    ) -> Result<T, GuestError> {
        self.call_keyed(name, p, d, timeout_ms, None, f).result
    }

    /// [`Runtime::call`] with the processor's bucket open in `keyed`;
    /// answers the session as the call left it.
    fn call_keyed<T>(
        &self,
        name: &str,
        p: &Prepared,
        d: Determinism,
        timeout_ms: u64,
        keyed: Option<Session>,
        f: impl FnOnce(&mut Store<GuestData>, &ProcessorExports) -> wasmtime::Result<T>,
    ) -> Called<T> {
        let Some(indices) = &p.processor else {
            let e = GuestError::Failure {
                message: format!("component {name:?} is not a processor: it does not export {PROCESSOR_INTERFACE}"),
                retryable: false,
            };
            return Called {
                result: Err(e),
                keyed,
                stderr: String::new(),
                lines: (Vec::new(), 0),
            };
        };
        self.run_instance(name, p, d, timeout_ms, keyed, |store, instance| {
            let processor = match indices {
                ProcessorIndices::V2(i) => ProcessorExports::V2(i.load(&mut *store, instance)?),
                ProcessorIndices::V3(i) => ProcessorExports::V3(i.load(&mut *store, instance)?),
            };
            f(store, &processor)
        })
    }

    /// Runs `f` with a fresh instance of `p` in a fresh store (the same
    /// limits and WASI context as every call): for typed calls through
    /// `bindgen!` bindings, as the benchmarks do.
    pub fn with_instance<T>(
        &self,
        name: &str,
        p: &Prepared,
        timeout_ms: u64,
        f: impl FnOnce(&mut Store<GuestData>, &wasmtime::component::Instance) -> wasmtime::Result<T>,
    ) -> Result<T, GuestError> {
        self.run_instance(name, p, Determinism::default(), timeout_ms, None, f)
            .result
    }

    /// Finds an exported function by WIT name or camelCase spelling.
    fn find_function(
        &self,
        p: &Prepared,
        function: &str,
    ) -> Option<wasmtime::component::ComponentExportIndex> {
        use wasmtime::component::types::ComponentItem;
        let matches = |wit: &str| wit == function || crate::value::camel(wit) == function;
        for (name, item) in p.component.component_type().exports(&self.engine) {
            match item.ty {
                ComponentItem::ComponentFunc(_) if matches(name) => {
                    return p.component.get_export_index(None, name);
                }
                ComponentItem::ComponentInstance(inst) => {
                    for (f, item) in inst.exports(&self.engine) {
                        if matches!(item.ty, ComponentItem::ComponentFunc(_)) && matches(f) {
                            let instance = p.component.get_export_index(None, name)?;
                            return p.component.get_export_index(Some(&instance), f);
                        }
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// Calls an exported function with JSON arguments mapped onto its WIT
    /// parameter types; the result maps back to JSON. A top-level
    /// `result<T, E>` answers `T`, or `CallError::Err(E)`.
    pub fn call_function(
        &self,
        name: &str,
        p: &Prepared,
        function: &str,
        args: &[serde_json::Value],
        timeout_ms: u64,
        opts: crate::value::ToVal,
    ) -> Result<serde_json::Value, CallError> {
        use crate::value::{to_json, to_val, Mismatch};
        use wasmtime::component::Val;
        let index = self
            .find_function(p, function)
            .ok_or_else(|| CallError::NoSuchFunction(function.to_string()))?;
        let mut argument_error = None;
        let out = self
            .run_instance(
                name,
                p,
                Determinism::default(),
                timeout_ms,
                None,
                |store, instance| {
                    let func = instance
                        .get_func(&mut *store, index)
                        .ok_or_else(|| wasmtime::Error::msg("the export is not a function"))?;
                    let ty = func.ty(&*store);
                    let params: Vec<_> = ty.params().map(|(_, t)| t).collect();
                    if params.len() != args.len() {
                        argument_error = Some(Mismatch {
                            path: "args".into(),
                            message: format!(
                                "{function} takes {} argument(s), got {}",
                                params.len(),
                                args.len()
                            ),
                        });
                        return Ok(None);
                    }
                    let mut values = Vec::with_capacity(args.len());
                    for (i, (arg, t)) in args.iter().zip(&params).enumerate() {
                        match to_val(arg, t, &format!("args[{i}]"), opts) {
                            Ok(v) => values.push(v),
                            Err(m) => {
                                argument_error = Some(m);
                                return Ok(None);
                            }
                        }
                    }
                    let mut results = vec![Val::Bool(false); ty.results().len()];
                    func.call(&mut *store, &values, &mut results)?;
                    Ok(Some(results))
                },
            )
            .result
            .map_err(CallError::Guest)?;
        let Some(results) = out else {
            return Err(CallError::Argument(
                argument_error.expect("set with the early return"),
            ));
        };
        match results.as_slice() {
            [] => Ok(serde_json::Value::Null),
            [Val::Result(Ok(v))] => {
                Ok(v.as_deref().map(to_json).unwrap_or(serde_json::Value::Null))
            }
            [Val::Result(Err(e))] => Err(CallError::Err(
                e.as_deref().map(to_json).unwrap_or(serde_json::Value::Null),
            )),
            [one] => Ok(to_json(one)),
            many => Ok(serde_json::Value::Array(many.iter().map(to_json).collect())),
        }
    }

    /// The processor's announcement (cached per digest).
    pub fn describe(
        &self,
        name: &str,
        p: &Prepared,
        timeout_ms: u64,
    ) -> Result<Announcement, GuestError> {
        if let Some(a) = p.announcement.get() {
            return Ok(a.clone());
        }
        let a = self.call(
            name,
            p,
            Determinism::default(),
            timeout_ms,
            |s, i| match i {
                ProcessorExports::V3(i) => i.streamhost_processor_processor().call_describe(s),
                ProcessorExports::V2(i) => {
                    i.streamhost_processor_processor()
                        .call_describe(s)
                        .map(|a| Announcement {
                            slug: a.slug,
                            version: a.version,
                            consumes: a.consumes,
                        })
                }
            },
        )?;
        let _ = p.announcement.set(a.clone());
        Ok(a)
    }

    /// Runs a reactor over one event (JSON text, as the HTTP API serves
    /// it) in a fresh instance with the event's determinism; answers the
    /// effects as returned (unchecked).
    pub fn react(
        &self,
        name: &str,
        p: &Prepared,
        event: &str,
        d: Determinism,
        timeout_ms: u64,
    ) -> Result<Vec<Effect>, GuestError> {
        let Some(indices) = &p.reactor else {
            return Err(GuestError::Failure {
                message: format!(
                    "component {name:?} is not a reactor: it does not export {REACTOR_INTERFACE}"
                ),
                retryable: false,
            });
        };
        let event = event.to_string();
        let called = self.run_instance(name, p, d, timeout_ms, None, |store, instance| {
            Ok(match indices {
                ReactorIndices::V3(i) => i
                    .load(&mut *store, instance)?
                    .streamhost_processor_reactor()
                    .call_react(&mut *store, &event)?
                    .map(|effects| effects.into_iter().map(reactor_effect).collect())
                    .map_err(|f| (f.message, f.retryable)),
                ReactorIndices::V2(i) => i
                    .load(&mut *store, instance)?
                    .streamhost_processor_reactor()
                    .call_react(&mut *store, &event)?
                    .map(|effects| effects.into_iter().map(v2_reactor_effect).collect())
                    .map_err(|f| (f.message, f.retryable)),
            })
        });
        let quoted = quoting(&called.stderr);
        called.result.and_then(|r| {
            r.map_err(|(message, retryable)| GuestError::Failure {
                message: format!("{message}{quoted}"),
                retryable,
            })
        })
    }

    /// The processor's state before any event.
    pub fn initial_state(
        &self,
        name: &str,
        p: &Prepared,
        timeout_ms: u64,
    ) -> Result<String, GuestError> {
        if let Some(state) = p.initial.get() {
            return Ok(state.clone());
        }
        let state = self.call(
            name,
            p,
            Determinism::default(),
            timeout_ms,
            |s, i| match i {
                ProcessorExports::V3(i) => i.streamhost_processor_processor().call_initial_state(s),
                ProcessorExports::V2(i) => i.streamhost_processor_processor().call_initial_state(s),
            },
        )?;
        let _ = p.initial.set(state.clone());
        Ok(state)
    }

    /// Folds one batch with the processor's bucket open in `keyed`;
    /// answers the session as the call left it (the caller keeps or drops
    /// its writes). The lines the guest writes are added to `output`, if
    /// given (a wake's span).
    #[allow(clippy::too_many_arguments)]
    pub fn fold(
        &self,
        name: &str,
        p: &Prepared,
        state: &str,
        batch: &Batch,
        d: Determinism,
        timeout_ms: u64,
        keyed: Session,
        output: Option<&Output>,
    ) -> (Result<Folded, GuestError>, Session) {
        let state = state.to_string();
        let called = self.call_keyed(name, p, d, timeout_ms, Some(keyed), |s, i| match i {
            ProcessorExports::V3(i) => i
                .streamhost_processor_processor()
                .call_fold(s, &state, batch),
            ProcessorExports::V2(i) => {
                use v2::processor::exports::streamhost::processor::processor as w;
                let info = &batch.stream;
                let old = w::Batch {
                    stream: w::StreamInfo {
                        project_id: info.project_id.clone(),
                        path: info.path.clone(),
                        stream_id: info.stream_id.clone(),
                        stream_created_at: info.stream_created_at.clone(),
                        max_offset: info.max_offset,
                    },
                    events: batch.events.clone(),
                    scanned_through_offset: batch.scanned_through_offset,
                };
                Ok(i.streamhost_processor_processor()
                    .call_fold(s, &state, &old)?
                    .map(|f| Folded {
                        state: f.state,
                        effects: f.effects.into_iter().map(v2_processor_effect).collect(),
                    })
                    .map_err(|f| FoldFailure {
                        message: f.message,
                        retryable: f.retryable,
                    }))
            }
        });
        let session = called.keyed.expect("the store keeps its session");
        if let Some(output) = output {
            output.add(called.lines);
        }
        let stderr = called.stderr;
        let out = called.result.and_then(|r| {
            r.map_err(|f| GuestError::Failure {
                message: format!("{}{}", f.message, quoting(&stderr)),
                retryable: f.retryable,
            })
        });
        (out, session)
    }
}

fn root_cause(e: &wasmtime::Error) -> String {
    format!("{e:#}")
}

/// Names of the functions a component exports (top level and in exported
/// instances), WIT spelling.
fn exported_functions(engine: &Engine, component: &Component) -> Vec<String> {
    use wasmtime::component::types::ComponentItem;
    let mut out = Vec::new();
    for (name, item) in component.component_type().exports(engine) {
        match item.ty {
            ComponentItem::ComponentFunc(_) => out.push(name.to_string()),
            ComponentItem::ComponentInstance(inst) => {
                for (f, item) in inst.exports(engine) {
                    if matches!(item.ty, ComponentItem::ComponentFunc(_)) {
                        out.push(f.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// What `Runtime::check` and `Runtime::validate` refuse before anything
/// else: bytes that are plainly not a component, and, from the names of its
/// imports and exports alone, an import the host does not give or another
/// version of `wit/` (refused before seconds of compiling).
fn refuse_from_names(bytes: &[u8]) -> Result<(), String> {
    if let Some(what) = not_a_component(bytes) {
        return Err(format!(
            "the body is not a valid WebAssembly component: {what}. {BUILD_HINT}"
        ));
    }
    match super::contract::interfaces(bytes) {
        Some(found) => super::contract::check(&found),
        None => Ok(()),
    }
}

/// The refusal of a component that exports no function.
fn no_exports() -> String {
    format!(
        "the component exports no functions: a processor must export the {PROCESSOR_INTERFACE} interface"
    )
}

/// A digest of component bytes: `sha256:<hex>`.
pub fn digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    let hash = sha2::Sha256::digest(bytes);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// How a processor or ITX component is built.
pub const BUILD_HINT: &str = "Build a component with `crate-type = [\"cdylib\"]` in the crate's [lib] and `cargo build --release --target wasm32-wasip2`, then send target/wasm32-wasip2/release/<crate>.wasm";

/// What `bytes` are when they are plainly not a component: an rlib, a core
/// module, or not WebAssembly at all (`None`: a component header).
pub fn not_a_component(bytes: &[u8]) -> Option<String> {
    const WASM_MAGIC: &[u8] = b"\0asm";
    if bytes.starts_with(b"!<arch>\n") {
        return Some(
            "it is an rlib (a Rust library archive): the crate lacks crate-type = [\"cdylib\"]"
                .into(),
        );
    }
    if !bytes.starts_with(WASM_MAGIC) {
        let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return Some(format!(
            "it is not WebAssembly ({} bytes starting {}, not 00 61 73 6d)",
            bytes.len(),
            if head.is_empty() {
                "with nothing".to_string()
            } else {
                head.join(" ")
            }
        ));
    }
    match bytes.get(4..8) {
        // version 1, layer 0: a core module.
        Some([1, 0, 0, 0]) => Some(
            "it is a core WebAssembly module, not a component (wasm32-unknown-unknown and wasm32-wasip1 build core modules)".into(),
        ),
        _ => None,
    }
}

/// A `Hasher` over sha256, for keys that must be stable across builds.
struct Sha256Hasher(sha2::Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        sha2::Digest::update(&mut self.0, bytes);
    }
    fn finish(&self) -> u64 {
        let digest = sha2::Digest::finalize(self.0.clone());
        u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
    }
}

impl Sha256Hasher {
    /// The first 16 hex digits of the digest.
    fn hex16(&self) -> String {
        format!("{:016x}", self.finish())
    }
}

#[cfg(test)]
mod cache_file_tests {
    use super::*;
    use wasmtime::CacheStore;

    #[test]
    fn a_compiled_function_reads_back_as_written_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FunctionCache::new(dir.path().join("functions"));
        assert!(cache.get(b"key-1").is_none());
        assert!(cache.insert(b"key-1", vec![1, 2, 3]));
        assert!(cache.insert(b"key-2", vec![4]));
        assert_eq!(cache.get(b"key-1").as_deref(), Some(&[1u8, 2, 3][..]));
        assert_eq!(cache.get(b"key-2").as_deref(), Some(&[4u8][..]));
        // Written again (another process compiled it too): the last wins.
        assert!(cache.insert(b"key-1", vec![9]));
        assert_eq!(cache.get(b"key-1").as_deref(), Some(&[9u8][..]));
        // A directory that cannot be made: a miss, not an error.
        let blocked = FunctionCache::new(dir.path().join("functions/../blocker/f"));
        std::fs::write(dir.path().join("blocker"), b"a file").unwrap();
        assert!(!blocked.insert(b"key-3", vec![1]));
        assert!(blocked.get(b"key-3").is_none());
    }

    #[test]
    fn plainly_wrong_bodies_say_what_they_are() {
        let rlib = not_a_component(b"!<arch>\n/               0").unwrap();
        assert!(rlib.contains("rlib"), "{rlib}");
        let core = not_a_component(b"\0asm\x01\0\0\0").unwrap();
        assert!(core.contains("core WebAssembly module"), "{core}");
        let junk = not_a_component(b"not wasm").unwrap();
        assert!(junk.contains("6e 6f 74 20 77 61 73 6d"), "{junk}");
        assert!(not_a_component(b"").unwrap().contains("0 bytes"));
        assert_eq!(
            not_a_component(b"\0asm\x0d\0\x01\0"),
            None,
            "a component header"
        );
    }

    #[test]
    fn the_compatibility_key_is_a_stable_sha256() {
        let mut h = Sha256Hasher(sha2::Sha256::default());
        h.write(b"streamhost");
        // The first 8 bytes of sha256("streamhost"): the same in every build.
        assert_eq!(h.hex16(), "ff69f8d82bdeb25d");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error whose source is an OS error, as the memfd crate's
    /// `AddSeals` is.
    #[derive(Debug)]
    struct Sealing(std::io::Error);

    impl std::fmt::Display for Sealing {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("cannot add seals to the memfd")
        }
    }

    impl std::error::Error for Sealing {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn only_a_kernel_busy_refusal_of_an_instantiation_is_tried_again() {
        // As wasmtime's `?` makes it (its text shows no cause), and within
        // a context.
        let busy =
            |errno| -> wasmtime::Error { Sealing(std::io::Error::from_raw_os_error(errno)).into() };
        assert!(transient(&busy(libc::EBUSY)));
        assert!(transient(&busy(libc::EBUSY).context("instantiating")));
        assert!(!transient(&busy(libc::ENOMEM)));
        assert!(!transient(&wasmtime::Error::msg(
            "the instance pool is full"
        )));
        assert!(!transient(&wasmtime::Error::new(
            wasmtime::Trap::UnreachableCodeReached
        )));
        // What a call answers names the cause.
        let message = format!("{:#}", instantiation_failed(busy(libc::EBUSY)));
        assert!(
            message
                .ends_with("cannot add seals to the memfd: Device or resource busy (os error 16)"),
            "{message}"
        );
    }

    /// The guest `file` of `examples/processors`, when built (`scripts/test`
    /// and CI build the guests before the tests).
    fn built(file: &str) -> Option<Vec<u8>> {
        std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../examples/processors/target/wasm32-wasip2/release")
                .join(file),
        )
        .ok()
    }

    /// The clocky guest (it reads the clock and random bytes, and counts
    /// its calls per instance), when built.
    fn clocky() -> Option<Vec<u8>> {
        built("clocky.wasm")
    }

    #[test]
    fn an_instance_made_ahead_never_serves_the_same_bytes_loaded_again() {
        let (Some(bytes), Some(other)) = (clocky(), built("counter.wasm")) else {
            eprintln!("the guests are not built: nothing to call");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        // One component's code in memory at a time.
        let runtime = Runtime::with_compiled_code_bytes(dir.path().into(), 1).unwrap();
        let d = digest(&bytes);
        let first = runtime.prepare(&d, || Ok(bytes.clone())).unwrap();
        runtime.make_ahead(&first, true);
        parked(&runtime, 1);
        // Another component pushes it out of memory; loaded again, it is
        // another `Component`, which the parked instance cannot serve.
        runtime
            .prepare(&digest(&other), || Ok(other.clone()))
            .unwrap();
        let again = runtime.prepare(&d, || Ok(bytes.clone())).unwrap();
        assert!(!Arc::ptr_eq(&first, &again), "loaded again");
        assert_eq!(
            runtime.instances_made_ahead().0,
            0,
            "the stale one is dropped"
        );
        let event = serde_json::json!({"offset": 1, "type": "t", "payload": {}}).to_string();
        let effects = runtime
            .react("clocky", &again, &event, Determinism::default(), 5_000)
            .unwrap();
        assert_eq!(effects.len(), 1);
    }

    /// The runtime's guest threads of this process in the run queue now
    /// (state `R` in `/proc/self/task/*/stat`).
    #[cfg(target_os = "linux")]
    fn runnable_guest_threads() -> usize {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return 0;
        };
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
            .filter(|stat| {
                // `pid (comm) state ...`: the name may hold spaces.
                let Some((head, rest)) = stat.rsplit_once(") ") else {
                    return false;
                };
                head.contains("(streamhost-gues") && rest.starts_with('R')
            })
            .count()
    }

    /// Spinning calls on the guest threads, three per core, each until its
    /// 300 ms of CPU time are spent: past their first slice they take turns
    /// (`turns.rs`), so no more of them are runnable than there are cores
    /// (each of them was, and a woken request then waited now and then for
    /// the kernel to get to it), and each still ends on its own timeout.
    #[cfg(target_os = "linux")]
    #[test]
    fn spinning_calls_on_the_guest_threads_take_turns_on_the_cores() {
        let Some(bytes) = built("kinds.wasm") else {
            eprintln!("the guests are not built: nothing to call");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let runtime = Arc::new(Runtime::new(dir.path().into()).unwrap());
        let p = runtime.prepare(&digest(&bytes), || Ok(bytes)).unwrap();
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let caller = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let calls: Vec<_> = (0..3 * cores)
            .map(|_| {
                let (guest, p) = (runtime.clone(), p.clone());
                runtime.run_guest(move || {
                    guest.call_function("kinds", &p, "spin", &[], 300, Default::default())
                })
            })
            .collect();
        // Sampled once they are all past their first slice (all but a
        // turn's worth in line: a call gets in line at a slice's end),
        // until the first ends.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while crate::turns::TURNS.waiting() < 2 * cores {
            assert!(
                std::time::Instant::now() < deadline && calls.iter().all(|c| !c.is_finished()),
                "{} calls in line of {}",
                crate::turns::TURNS.waiting(),
                3 * cores
            );
            std::thread::yield_now();
        }
        let mut samples = Vec::new();
        while calls.iter().all(|c| !c.is_finished()) && samples.len() < 2_000 {
            samples.push(runnable_guest_threads());
            std::thread::yield_now();
        }
        let answers: Vec<_> = caller.block_on(async {
            let mut answers = Vec::new();
            for c in calls {
                answers.push(c.await.unwrap());
            }
            answers
        });
        for a in &answers {
            assert!(
                matches!(
                    a,
                    Err(CallError::Guest(GuestError::Timeout { ms: 300, .. }))
                ),
                "{a:?}"
            );
        }
        assert!(samples.len() >= 20, "only {} samples", samples.len());
        samples.sort_unstable();
        let median = samples[samples.len() / 2];
        assert!(
            median <= cores,
            "{median} guest threads runnable at the median of {} samples on {cores} cores: {samples:?}",
            samples.len()
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn guest_work_runs_on_idle_priority_threads_and_the_pool_closes_inside_a_task() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(dir.path().into()).unwrap();
        // Awaited from another runtime (as the host's tasks do).
        let caller = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        caller.block_on(async move {
            let (name, policy) = runtime
                .run_guest(|| {
                    let name = std::thread::current().name().map(String::from);
                    // SAFETY: a plain system call on the calling thread.
                    let policy = unsafe { libc::sched_getscheduler(0) };
                    (name, policy)
                })
                .await
                .unwrap();
            assert_eq!(name.as_deref(), Some("streamhost-guest"));
            assert_eq!(policy, libc::SCHED_IDLE, "a guest thread's policy");
            let panicked = runtime
                .run_guest(|| panic!("the guest's work panicked"))
                .await;
            assert!(panicked.unwrap_err().is_panic());
            // The last handle dropped inside a task: the pool lets its
            // threads go without blocking it.
            drop(runtime);
        });
    }

    /// A verify on a server whose cores are all busy: the call, on a
    /// lowest-priority thread, is preempted for longer than its timeout
    /// while it folds, and still answers, since its timeout counts the CPU
    /// time it got. (`.config/nextest.toml` runs it alone: it keeps every
    /// core busy for 2.5 s.)
    #[cfg(target_os = "linux")]
    #[test]
    fn a_call_on_an_idle_thread_counts_the_cpu_it_got_not_its_wait_for_a_core() {
        let Some(bytes) = built("counter.wasm") else {
            eprintln!("the guests are not built: nothing to call");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let runtime = Arc::new(Runtime::new(dir.path().into()).unwrap());
        let p = runtime
            .prepare(&digest(&bytes), || Ok(bytes.clone()))
            .unwrap();
        let events: Vec<String> = (1..=100_000)
            .map(|i| {
                format!(
                    r#"{{"offset":{i},"type":"t","payload":{{"n":1}},"createdAt":"2026-12-06T00:00:00.000Z"}}"#
                )
            })
            .collect();
        let batch = Batch {
            stream: StreamInfo {
                project_id: None,
                path: "/s".into(),
                stream_id: "s".into(),
                stream_created_at: "2026-12-06T00:00:00.000Z".into(),
                max_offset: 100_000,
            },
            events: format!("[{}]", events.join(",")),
            scanned_through_offset: 100_000,
        };
        fn fold(
            runtime: &Runtime,
            p: &Prepared,
            batch: &Batch,
            timeout_ms: u64,
        ) -> (Result<String, GuestError>, Duration) {
            let started = std::time::Instant::now();
            let (folded, _) = runtime.fold(
                "counter",
                p,
                "{}",
                batch,
                Determinism::default(),
                timeout_ms,
                crate::keyed::Bucket::empty().session(),
                None,
            );
            (folded.map(|f| f.state), started.elapsed())
        }
        // Alone, on this thread: the fold takes a fraction of a second.
        let (alone, took) = fold(&runtime, &p, &batch, 10_000);
        alone.unwrap();
        assert!(took < Duration::from_millis(900), "alone it took {took:?}");
        // Every core busy at the normal priority from the call's start
        // until it has run 2.5 times its timeout: the lowest-priority thread
        // waits most of that.
        let busy = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let called = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let load = {
            let (busy, called) = (busy.clone(), called.clone());
            std::thread::spawn(move || {
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while !called.load(std::sync::atomic::Ordering::Acquire) {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the call never started"
                    );
                    std::thread::yield_now();
                }
                let spinners: Vec<_> = (0..cores)
                    .map(|_| {
                        let busy = busy.clone();
                        std::thread::spawn(move || {
                            while busy.load(std::sync::atomic::Ordering::Relaxed) {
                                std::hint::spin_loop();
                            }
                        })
                    })
                    .collect();
                // The cores stay busy until the call has been running 2.5
                // times its timeout.
                let since = std::time::Instant::now();
                // (Spinning, not yielding: a yield would hand the core to
                // the lowest-priority thread.)
                while since.elapsed() < Duration::from_millis(2500) {
                    std::hint::spin_loop();
                }
                busy.store(false, std::sync::atomic::Ordering::Relaxed);
                for s in spinners {
                    s.join().unwrap();
                }
            })
        };
        let caller = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (answered, waited) = caller.block_on({
            let (runtime, guest) = (runtime.clone(), runtime.clone());
            async move {
                runtime
                    .run_guest(move || {
                        called.store(true, std::sync::atomic::Ordering::Release);
                        fold(&guest, &p, &batch, 1_000)
                    })
                    .await
                    .unwrap()
            }
        });
        load.join().unwrap();
        let state = answered.unwrap_or_else(|e| panic!("after {waited:?}: {e}"));
        assert!(state.contains("100000"), "{state}");
        assert!(
            waited > Duration::from_millis(1000),
            "it was not starved: {waited:?}"
        );
    }

    /// A wake waiting for a background compile finds the processor's
    /// announcement and initial state answered (a wake that raced them
    /// would pay for the component's first instantiation inside its own
    /// deadline), and the compile thread's calls count the CPU they get.
    #[test]
    fn a_background_compile_ends_once_the_first_calls_of_a_wake_are_answered() {
        let Some(bytes) = built("counter.wasm") else {
            eprintln!("the guests are not built: nothing to compile");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let runtime = Arc::new(Runtime::new(dir.path().into()).unwrap());
        let d = digest(&bytes);
        runtime.compile_in_background(&d, move || Ok(bytes));
        assert!(runtime.is_compiling(&d));
        // (What `Runtime::compiled` waits for; looked at without a pause,
        // so the first calls cannot end between the compile's end and the
        // look below.)
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while runtime.is_compiling(&d) {
            assert!(
                std::time::Instant::now() < deadline,
                "the compile ended within two minutes"
            );
            std::thread::yield_now();
        }
        let p = runtime
            .prepare(&d, || panic!("compiled already: nothing to read"))
            .unwrap();
        let announced = p.announcement.get().expect("describe answered first");
        assert_eq!(announced.slug, "counter");
        assert!(p.initial.get().is_some(), "initial-state answered first");
        // The compile thread's priority, lowered, makes its calls' deadlines
        // count CPU time (as on the guest threads).
        let lowered = std::thread::spawn(|| {
            lower_this_threads_priority();
            LOWERED_THREAD.with(std::cell::Cell::get)
        });
        assert!(lowered.join().unwrap(), "a lowered thread is marked");
        assert!(!LOWERED_THREAD.with(std::cell::Cell::get));
    }

    /// Waits until `runtime` has `n` instances parked, at most ten seconds.
    fn parked(runtime: &Runtime, n: usize) {
        assert!(
            runtime.wait_for_instances_made_ahead(Duration::from_secs(10), |(p, _)| p == n),
            "never {n} parked"
        );
    }

    #[test]
    fn a_call_on_an_instance_made_ahead_sees_its_own_environment_as_a_fresh_instance_does() {
        let Some(bytes) = clocky() else {
            // `scripts/test` and CI build the guests before the tests.
            eprintln!("the clocky guest is not built: nothing to call");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let ahead = Runtime::new(dir.path().join("ahead")).unwrap();
        let fresh = Runtime::new(dir.path().join("fresh")).unwrap();
        let d = digest(&bytes);
        let p = ahead.prepare(&d, || Ok(bytes.clone())).unwrap();
        let q = fresh.prepare(&d, || Ok(bytes.clone())).unwrap();
        // The second runtime makes every instance at its call.
        q.instantiation
            .reads_environment
            .store(true, std::sync::atomic::Ordering::Relaxed);
        for offset in [1u64, 2, 3] {
            // An instance made ahead for each call (whatever clocky's
            // instantiation costs), made with a placeholder environment.
            ahead.make_ahead(&p, true);
            parked(&ahead, 1);
            let served = ahead.instances_made_ahead().1;
            let event = serde_json::json!({
                "offset": offset, "type": "t", "payload": {},
                "createdAt": "2026-12-04T10:00:00Z",
            })
            .to_string();
            let env =
                || Determinism::for_event("stream-a", offset, 1_796_378_400_000 + offset as i64);
            let made_ahead = ahead.react("clocky", &p, &event, env(), 5_000).unwrap();
            // The next one may already be made ahead after the call (when
            // clocky's instantiation took long on a busy machine): what
            // counts is that this call was served by the parked one.
            assert_eq!(
                ahead.instances_made_ahead().1,
                served + 1,
                "the call took the instance made ahead"
            );
            let made_here = fresh.react("clocky", &q, &event, env(), 5_000).unwrap();
            assert_eq!(fresh.instances_made_ahead(), (0, 0));
            let seen = format!("{made_ahead:?}");
            assert_eq!(seen, format!("{made_here:?}"));
            // The call's clock (not the placeholder's 0), and an instance
            // that served no call before.
            assert!(
                seen.contains(&format!("\\\"clockMs\\\":{}", 1_796_378_400_000 + offset)),
                "{seen}"
            );
            assert!(seen.contains("\\\"counter\\\":1"), "{seen}");
        }
    }
}
