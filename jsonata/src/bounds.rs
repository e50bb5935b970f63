//! Value-size bounds (a patch of this copy; see PATCHES.md).
//!
//! With [`EvaluatorOptions::max_value_bytes`] set, no value an evaluation
//! builds may be larger than that many bytes, measured as its JSON text
//! (strings by their UTF-8 length, numbers as 8 bytes, one byte of
//! punctuation per item). Two mechanisms enforce it:
//!
//! - **Before and after each built-in.** Built-ins whose result can be far
//!   larger than their arguments (`$pad`, `$join`, `$string`, `$replace`,
//!   ranges, `&`) are refused *before* they allocate; the result of every
//!   built-in is measured after it (cheaply: the walk stops at the bound).
//! - **An allocation budget**, for values built step by step (a path over a
//!   range, an object constructor, recursion). A host that installs a
//!   counting global allocator reports every allocation and release with
//!   [`allocated`] and [`released`]; an evaluation started under
//!   [`Budget::start`] fails with U1004 at its next node once the bytes
//!   allocated on its thread and still live exceed the budget.
//!
//! Both raise `U1004: ...` (U1001 to U1003 are the crate's own codes).
//!
//! [`EvaluatorOptions::max_value_bytes`]: crate::evaluator::EvaluatorOptions::max_value_bytes

use std::cell::Cell;

use crate::evaluator::{EvaluatorError, EvaluatorOptions};
use crate::value::JValue;

/// Bytes a number counts for.
const NUMBER_BYTES: usize = 8;

/// The approximate JSON size of `v`, counted until it passes `limit` (the
/// walk stops there, so measuring costs at most about `limit` steps).
pub fn value_bytes(v: &JValue, limit: usize) -> usize {
    let mut total = 0usize;
    measure(v, limit, &mut total);
    total
}

fn measure(v: &JValue, limit: usize, total: &mut usize) {
    if *total > limit {
        return;
    }
    match v {
        JValue::String(s) => *total += s.len() + 2,
        JValue::Number(_) => *total += NUMBER_BYTES,
        JValue::Array(items) => {
            *total += 2;
            for item in items.iter() {
                *total += 1;
                measure(item, limit, total);
                if *total > limit {
                    return;
                }
            }
        }
        JValue::Object(map) => {
            *total += 2;
            for (k, item) in map.iter() {
                *total += k.len() + 4;
                measure(item, limit, total);
                if *total > limit {
                    return;
                }
            }
        }
        JValue::Regex { pattern, flags } => *total += pattern.len() + flags.len(),
        _ => *total += 4,
    }
}

fn too_large(what: &str, bytes: usize, limit: usize) -> EvaluatorError {
    EvaluatorError::EvaluationError(format!(
        "U1004: {what} would build a value of {bytes} bytes or more, over the {limit}-byte limit"
    ))
}

/// Refuses a value of `bytes` bytes that `what` is about to build.
#[inline]
pub(crate) fn check_bytes(
    what: &str,
    bytes: usize,
    options: &EvaluatorOptions,
) -> Result<(), EvaluatorError> {
    match options.max_value_bytes {
        Some(limit) if bytes > limit => Err(too_large(what, bytes, limit)),
        _ => Ok(()),
    }
}

/// Refuses `v`, the result of built-in `name`, when it is over the bound.
#[inline]
pub(crate) fn check_builtin_result(
    name: &str,
    v: &JValue,
    options: &EvaluatorOptions,
) -> Result<(), EvaluatorError> {
    match options.max_value_bytes {
        Some(limit) => match v {
            JValue::Number(_) | JValue::Bool(_) | JValue::Null | JValue::Undefined => Ok(()),
            _ => {
                let bytes = value_bytes(v, limit);
                if bytes > limit {
                    Err(too_large(&format!("${name}"), bytes, limit))
                } else {
                    Ok(())
                }
            }
        },
        None => Ok(()),
    }
}

/// Refuses a built-in call before it allocates, when its arguments alone
/// say its result would be over the bound.
pub(crate) fn check_builtin_args(
    name: &str,
    args: &[JValue],
    options: &EvaluatorOptions,
) -> Result<(), EvaluatorError> {
    let Some(limit) = options.max_value_bytes else {
        return Ok(());
    };
    let bytes = |v: Option<&JValue>| v.map_or(0, |v| value_bytes(v, limit));
    let needed = match name {
        // The width, whatever the string.
        "pad" => match args.get(1) {
            Some(JValue::Number(n)) if n.is_finite() => n.abs().min(usize::MAX as f64) as usize,
            _ => 0,
        },
        // Every item and a separator between each two.
        "join" => match args.first() {
            Some(JValue::Array(items)) => {
                let separator = match args.get(1) {
                    Some(JValue::String(s)) => s.len(),
                    _ => 0,
                };
                items
                    .len()
                    .saturating_sub(1)
                    .saturating_mul(separator)
                    .saturating_add(bytes(args.first()))
            }
            other => bytes(other),
        },
        // Its JSON text; pretty-printing adds indentation per item.
        "string" => {
            let text = bytes(args.first());
            if matches!(args.get(1), Some(JValue::Bool(true))) {
                text.saturating_mul(2)
            } else {
                text
            }
        }
        "append" | "zip" | "merge" | "spread" => args
            .iter()
            .fold(0usize, |sum, a| sum.saturating_add(value_bytes(a, limit))),
        // Up to nine bytes (`%XX` of a multi-byte character) per byte.
        "encodeUrl" | "encodeUrlComponent" => bytes(args.first()).saturating_mul(3),
        "base64encode" => bytes(args.first()).saturating_mul(4) / 3,
        _ => 0,
    };
    if needed > limit {
        return Err(too_large(&format!("${name}"), needed, limit));
    }
    Ok(())
}

/// The bytes `$replace` would build: the subject with each of at most
/// `matches` matches replaced by `replacement_bytes`.
pub(crate) fn check_replace(
    subject_bytes: usize,
    matches: usize,
    replacement_bytes: usize,
    options: &EvaluatorOptions,
) -> Result<(), EvaluatorError> {
    check_bytes(
        "$replace",
        subject_bytes.saturating_add(matches.saturating_mul(replacement_bytes)),
        options,
    )
}

thread_local! {
    /// Bytes allocated on this thread and not yet released, as reported by
    /// the host's allocator (only differences are read).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The running budget: the `LIVE` it started at and its size in bytes;
    /// size 0 when there is none.
    static BUDGET: Cell<(isize, usize)> = const { Cell::new((0, 0)) };
}

/// Reports an allocation of `bytes` on this thread. Called by a host's
/// global allocator; it must not allocate, and does not.
#[inline]
pub fn allocated(bytes: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().wrapping_add(bytes as isize)));
}

/// Reports a release of `bytes` on this thread (see [`allocated`]).
#[inline]
pub fn released(bytes: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().wrapping_sub(bytes as isize)));
}

/// An allocation budget for the evaluations run on this thread while it
/// lives: they fail with U1004 once more than `bytes` allocated since
/// [`Budget::start`] are still live. Without a counting allocator reporting
/// to [`allocated`], the budget never trips.
pub struct Budget {
    previous: (isize, usize),
}

impl Budget {
    /// Starts a budget of `bytes` (at least 1) on this thread.
    pub fn start(bytes: usize) -> Budget {
        let live = LIVE.with(Cell::get);
        let previous = BUDGET.with(|b| b.replace((live, bytes.max(1))));
        Budget { previous }
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        BUDGET.with(|b| b.set(self.previous));
    }
}

/// Fails once the thread's budget is spent.
#[inline]
pub(crate) fn check_budget() -> Result<(), EvaluatorError> {
    let (start, bytes) = BUDGET.with(Cell::get);
    if bytes == 0 {
        return Ok(());
    }
    let used = LIVE.with(Cell::get).wrapping_sub(start);
    if used > bytes as isize {
        return Err(EvaluatorError::EvaluationError(format!(
            "U1004: the evaluation holds {used} bytes of values, over its {bytes}-byte budget"
        )));
    }
    Ok(())
}

/// Refuses `left & right` over the bound, before the strings are built.
#[inline]
pub(crate) fn check_concat(
    left: &JValue,
    right: &JValue,
    options: &EvaluatorOptions,
) -> Result<(), EvaluatorError> {
    let Some(limit) = options.max_value_bytes else {
        return Ok(());
    };
    let text = |v: &JValue| match v {
        JValue::String(s) => s.len(),
        other => value_bytes(other, limit),
    };
    check_bytes("&", text(left).saturating_add(text(right)), options)
}

thread_local! {
    /// The deadline of the evaluation running on this thread: its CPU-time
    /// start and its bound in ms (`None`: no deadline). The start is read
    /// at the first check that reads the clock ([`since_deadline_start`]),
    /// not when the deadline starts: most evaluations (a filter, a
    /// transform) end before that check and never read it.
    static DEADLINE: Cell<Option<(Option<std::time::Duration>, u64)>> = const { Cell::new(None) };
    /// Work done since the clock was last read (see [`check_deadline`]).
    static WORK: Cell<usize> = const { Cell::new(0) };
}

/// Work units between two reads of the thread's CPU clock in
/// [`check_deadline`] (a unit is about one value comparison: a few
/// nanoseconds, so the clock is read every few tens of microseconds).
const WORK_PER_CLOCK_READ: usize = 4096;

/// Patched: a deadline for the evaluations run on this thread while it
/// lives, checked inside the built-ins whose work is not linear in their
/// input (`$distinct`) as well as the evaluator's loops: they fail with
/// D1012 once `ms` of the thread's CPU time have passed since
/// [`Deadline::start`].
pub struct Deadline {
    previous: Option<(Option<std::time::Duration>, u64)>,
}

impl Deadline {
    /// Starts a deadline of `ms` on this thread. Its clock starts at the
    /// evaluation's first read of the thread's CPU clock: at its
    /// [`CHECKS_PER_CLOCK_READ`]th check or after [`WORK_PER_CLOCK_READ`]
    /// units of a built-in's work, a few microseconds in.
    pub fn start(ms: u64) -> Deadline {
        let previous = DEADLINE.with(|d| d.replace(Some((None, ms))));
        WORK.with(|w| w.set(0));
        CLOCK_COUNTDOWN.with(|c| c.set(CHECKS_PER_CLOCK_READ - 1));
        Deadline { previous }
    }
}

/// The thread's CPU time since its deadline's start, starting it now if
/// it has not started (then zero); `None` without a deadline.
fn since_deadline_start() -> Option<(std::time::Duration, u64)> {
    DEADLINE.with(|d| {
        let (start, ms) = d.get()?;
        let now = thread_cpu_time();
        let start = start.unwrap_or_else(|| {
            d.set(Some((Some(now), ms)));
            now
        });
        Some((now.saturating_sub(start), ms))
    })
}

impl Drop for Deadline {
    fn drop(&mut self) {
        DEADLINE.with(|d| d.set(self.previous));
    }
}

/// Counts `work` units done by a built-in and fails with D1012 once the
/// thread's deadline has passed. The clock is read once per
/// [`WORK_PER_CLOCK_READ`] units, so a call is cheap.
#[inline]
pub(crate) fn check_deadline(work: usize) -> Result<(), String> {
    if DEADLINE.with(Cell::get).is_none() {
        return Ok(());
    }
    let done = WORK.with(|w| {
        let done = w.get().saturating_add(work);
        w.set(if done >= WORK_PER_CLOCK_READ { 0 } else { done });
        done
    });
    if done < WORK_PER_CLOCK_READ {
        return Ok(());
    }
    let Some((spent, ms)) = since_deadline_start() else {
        return Ok(());
    };
    if spent.as_millis() as u64 > ms {
        return Err(format!(
            "D1012: Evaluation timeout after {ms} milliseconds. Check for infinite loop"
        ));
    }
    Ok(())
}

/// Patched: the clock `timeout_ms` is measured on: the evaluating
/// thread's CPU time, not the wall clock. The host evaluates conditions on
/// low-priority threads; on saturated CPUs they wait without running, and a
/// wall clock would time out trivial expressions. A runaway expression
/// spends CPU, so it still reaches the bound.
#[derive(Clone, Copy, Debug)]
pub struct CpuInstant(Option<std::time::Duration>);

impl CpuInstant {
    /// The evaluating thread's CPU time now; within a [`Deadline`] on this
    /// thread, its start (one clock for both, read when first needed: each
    /// read is a system call).
    pub fn now() -> CpuInstant {
        match DEADLINE.with(Cell::get) {
            Some(_) => CpuInstant(None),
            None => CpuInstant(Some(thread_cpu_time())),
        }
    }

    /// CPU time the thread has spent since `self` (within a deadline:
    /// since its clock started).
    pub fn elapsed(&self) -> std::time::Duration {
        match self.0 {
            Some(start) => thread_cpu_time().saturating_sub(start),
            None => since_deadline_start().map_or(std::time::Duration::ZERO, |(spent, _)| spent),
        }
    }

    /// Patched: whether more than `ms` of the thread's CPU time have passed
    /// since `self`, for the checks the evaluator makes at every node and
    /// loop step. The clock is read at one check in
    /// [`CHECKS_PER_CLOCK_READ`] on this thread: reading a thread's CPU
    /// clock is a system call that locks its CPU's run queue (Linux), and
    /// made at every node it cost more than most nodes do, while one
    /// thread's busy evaluation held the queue of the core every other
    /// thread wakes on. Between reads a thread evaluates a few tens of
    /// microseconds of nodes, so the bound holds to well within a
    /// millisecond.
    #[inline]
    pub fn exceeded(&self, ms: u64) -> bool {
        let read = CLOCK_COUNTDOWN.with(|c| {
            let left = c.get();
            c.set(left.checked_sub(1).unwrap_or(CHECKS_PER_CLOCK_READ - 1));
            left == 0
        });
        read && self.elapsed().as_millis() as u64 > ms
    }
}

/// Node and loop checks between two reads of the thread's CPU clock in
/// [`CpuInstant::exceeded`].
const CHECKS_PER_CLOCK_READ: u32 = 64;

thread_local! {
    /// Checks left before [`CpuInstant::exceeded`] reads the clock again.
    static CLOCK_COUNTDOWN: Cell<u32> = const { Cell::new(0) };
    /// Reads of the thread's CPU clock by these bounds.
    static CLOCK_READS: Cell<u64> = const { Cell::new(0) };
}

/// Patched: how many times these bounds have read the calling thread's CPU
/// clock (a system call each), for tests and diagnostics.
pub fn clock_reads() -> u64 {
    CLOCK_READS.with(Cell::get)
}

#[cfg(unix)]
fn thread_cpu_time() -> std::time::Duration {
    CLOCK_READS.with(|r| r.set(r.get() + 1));
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; the clock id is a constant
    // every Unix this builds for supports.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(not(unix))]
fn thread_cpu_time() -> std::time::Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}
