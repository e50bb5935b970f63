//! Storage faults injected on purpose, for the reliability tests and the
//! chaos runner; off unless `STREAMHOST_FAULTS` is set.
//!
//! `STREAMHOST_FAULTS=before-commit=1/50,after-commit=1/70` fails every 50th
//! group commit just before its `COMMIT` (the transaction is rolled back)
//! and every 70th just after it (the transaction is durable but reported as
//! failed: the unknown outcome an I/O error during fsync leaves). Commits
//! are counted from 1; when both fire on one commit, `before-commit` wins.
//! `writer-panic=1/N` panics the writer thread at every Nth group commit,
//! before its `COMMIT` (a broken invariant: the process stops).
//! `wake-stall-ms=N` holds the process's first processor wake for N ms
//! after its fold, before its commit (a slow first compile, once).

use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that switches faults on.
pub const ENV: &str = "STREAMHOST_FAULTS";

/// What to do to one group commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// Roll back instead of committing, and report an I/O error.
    BeforeCommit,
    /// Commit, then report an I/O error.
    AfterCommit,
    /// Panic before committing.
    Panic,
}

/// The configured faults and the commits counted so far.
#[derive(Debug, Default)]
pub struct Faults {
    before_every: Option<u64>,
    after_every: Option<u64>,
    panic_every: Option<u64>,
    wake_stall_ms: Option<u64>,
    commits: AtomicU64,
}

impl Faults {
    /// Faults from [`ENV`]; none when it is unset or empty.
    pub fn from_env() -> anyhow::Result<Faults> {
        match std::env::var(ENV) {
            Ok(text) => Faults::parse(&text).map_err(|e| anyhow::anyhow!("{ENV}: {e}")),
            Err(_) => Ok(Faults::default()),
        }
    }

    /// Parses `point=1/N[,point=1/N]`.
    pub fn parse(text: &str) -> Result<Faults, String> {
        let mut faults = Faults::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (point, rate) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not point=1/N"))?;
            if point == "wake-stall-ms" {
                let ms = rate
                    .parse::<u64>()
                    .map_err(|_| format!("{rate:?} in {part:?} is not a number of milliseconds"))?;
                faults.wake_stall_ms = Some(ms);
                continue;
            }
            let every = rate
                .strip_prefix("1/")
                .and_then(|n| n.parse::<u64>().ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{rate:?} in {part:?} is not 1/N with N >= 1"))?;
            match point {
                "before-commit" => faults.before_every = Some(every),
                "after-commit" => faults.after_every = Some(every),
                "writer-panic" => faults.panic_every = Some(every),
                other => {
                    return Err(format!(
                        "unknown fault point {other:?} (before-commit, after-commit, writer-panic or wake-stall-ms)"
                    ))
                }
            }
        }
        Ok(faults)
    }

    /// Whether any fault is configured.
    pub fn active(&self) -> bool {
        self.before_every.is_some() || self.after_every.is_some() || self.panic_every.is_some()
    }

    /// Counts a group commit and says what to do to it.
    pub fn next(&self) -> Fault {
        if !self.active() {
            return Fault::None;
        }
        let n = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        let hits = |every: Option<u64>| every.is_some_and(|e| n.is_multiple_of(e));
        if hits(self.panic_every) {
            Fault::Panic
        } else if hits(self.before_every) {
            Fault::BeforeCommit
        } else if hits(self.after_every) {
            Fault::AfterCommit
        } else {
            Fault::None
        }
    }
}

/// Holds the process's first processor wake for `wake-stall-ms` (see the
/// module's documentation); nothing unless that fault is set.
pub fn stall_first_wake() {
    static STALL: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    static STALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let stall = STALL.get_or_init(|| Faults::from_env().ok().and_then(|f| f.wake_stall_ms));
    if let Some(ms) = *stall {
        if !STALLED.swap(true, Ordering::Relaxed) {
            tracing::warn!(ms, "the first wake is held on purpose ({ENV})");
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rates_and_fires_on_every_nth_commit() {
        let f = Faults::parse("before-commit=1/3, after-commit=1/2").unwrap();
        let seen: Vec<Fault> = (0..6).map(|_| f.next()).collect();
        use Fault::*;
        assert_eq!(
            seen,
            [
                None,
                AfterCommit,
                BeforeCommit,
                AfterCommit,
                None,
                BeforeCommit
            ]
        );
        assert!(!Faults::parse("").unwrap().active());
        let f = Faults::parse("writer-panic=1/2,before-commit=1/1").unwrap();
        assert_eq!([f.next(), f.next()], [BeforeCommit, Panic]);
        let f = Faults::parse("wake-stall-ms=1500").unwrap();
        assert_eq!(f.wake_stall_ms, Some(1500));
        assert_eq!(f.next(), None, "a stall fails no commit");
        assert_eq!(Faults::default().next(), Fault::None);
    }

    #[test]
    fn bad_specs_name_the_bad_part() {
        for (spec, mention) in [
            ("before-commit", "\"before-commit\" is not point=1/N"),
            ("after-commit=1/0", "\"1/0\""),
            ("after-commit=2/3", "\"2/3\""),
            ("during-commit=1/2", "unknown fault point \"during-commit\""),
        ] {
            let e = Faults::parse(spec).unwrap_err();
            assert!(e.contains(mention), "{spec}: {e}");
        }
    }
}
