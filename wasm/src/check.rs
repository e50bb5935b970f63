//! `streamhost test`: a processor over fixture events, checked for the
//! properties every fold must have here, besides the author's expected
//! state: no trap; the same state (and keyed state) on a second run; the
//! same state whatever the batch cuts (the wakes cut batches as events
//! arrive; seeded random cuts here). The fold is the wakes' own
//! (`wake::fold_events`), so what passes here folds the same in the server.
//! The first counterexample is reported as a fixture (the state before the
//! batch, the batch's events) with a `wasmtime` command that replays it.

use serde_json::Value;

use super::keyed::{Bucket, Writes};
use super::runtime::StreamInfo;
use super::wake::{fold_events, Guest};
use streamhost_core::stream::Event;

/// Events per batch at most (as a wake's).
const BATCH_MAX: usize = 1000;

/// What to check.
pub struct Check<'a> {
    pub guest: Guest<'a>,
    /// Where the component file is, for the repro command.
    pub component_path: &'a str,
    pub stream: StreamInfo,
    pub events: &'a [Event],
    /// The state the fold must end in, if the author gave one.
    pub expected: Option<Value>,
    /// Random cuts to try.
    pub splits: usize,
    pub seed: u64,
}

/// A fold's end: its state (JSON) and keyed state.
#[derive(Debug, Clone, PartialEq)]
struct End {
    state: Value,
    keys: Writes,
}

/// The first property that did not hold, with what reproduces it.
#[derive(Debug)]
pub struct Counterexample {
    /// Which property, and how it failed.
    pub what: String,
    /// The state before the batch that went wrong (JSON text).
    pub state_before: Option<String>,
    /// That batch's events, one JSON object per line.
    pub fixture: Option<String>,
    /// The `wasmtime run` command that replays that batch's call.
    pub repro: Option<String>,
}

impl std::fmt::Display for Counterexample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.what)?;
        if let Some(state) = &self.state_before {
            write!(f, "\nthe state before that batch:\n  {state}")?;
        }
        if let Some(fixture) = &self.fixture {
            write!(f, "\nthe batch, as a fixture (JSONL):")?;
            for line in fixture.lines() {
                write!(f, "\n  {line}")?;
            }
        }
        if let Some(repro) = &self.repro {
            write!(f, "\nreproduce with: {repro}")?;
        }
        Ok(())
    }
}

/// A small seeded generator (splitmix64): cuts that a seed reproduces.
struct Cuts(u64);

impl Cuts {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Batch sizes that add up to `n`, each 1..=BATCH_MAX.
    fn sizes(&mut self, n: usize) -> Vec<usize> {
        let mut left = n;
        let mut sizes = Vec::new();
        while left > 0 {
            let most = left.min(BATCH_MAX).min(1 + n / 2);
            let size = 1 + (self.next() % most as u64) as usize;
            sizes.push(size);
            left -= size;
        }
        sizes
    }
}

impl Check<'_> {
    /// Runs every check; answers the lines of what held, or the first
    /// counterexample.
    pub fn run(&self, mut passed: impl FnMut(String)) -> Result<(), Counterexample> {
        let n = self.events.len();
        // The reference: one event at a time (no cut to depend on).
        let one_by_one = vec![1; n];
        let reference = self.fold(&one_by_one, None)?;
        passed(format!("folds {n} events without a trap"));
        if self.fold(&one_by_one, None)? != reference {
            return Err(Counterexample {
                what: "a second run of the same fold ended in another state: the fold depends on something besides its events".into(),
                state_before: None,
                fixture: None,
                repro: None,
            });
        }
        passed("a second run ends in the same state".into());
        let whole: Vec<usize> = (0..n.div_ceil(BATCH_MAX))
            .map(|i| (n - i * BATCH_MAX).min(BATCH_MAX))
            .collect();
        let mut cuts = Cuts(self.seed);
        for i in 0..=self.splits {
            let sizes = if i == 0 { whole.clone() } else { cuts.sizes(n) };
            if self.fold(&sizes, None)? != reference {
                // Where it goes wrong: the first batch whose end differs
                // from folding one event at a time.
                return Err(self.locate(&sizes, i));
            }
        }
        passed(format!(
            "the same state whatever the batch cuts: whole batches and {} random cuts (seed {})",
            self.splits, self.seed
        ));
        if let Some(expected) = &self.expected {
            if &reference.state != expected {
                return Err(Counterexample {
                    what: format!(
                        "the state is not the expected one:\n  expected {expected}\n  got      {}",
                        reference.state
                    ),
                    state_before: None,
                    fixture: None,
                    repro: None,
                });
            }
            passed("the state is the expected one".into());
        }
        Ok(())
    }

    /// Folds the events cut into batches of `sizes`; with `trace`, records
    /// (through, state text before the batch, state after) per batch.
    fn fold(
        &self,
        sizes: &[usize],
        mut trace: Option<&mut Vec<(usize, String, Value)>>,
    ) -> Result<End, Counterexample> {
        let g = &self.guest;
        let mut state = g
            .runtime
            .initial_state(g.component, g.prepared, g.timeout_ms)
            .map_err(|e| Counterexample {
                what: format!("initial-state failed: {e}"),
                state_before: None,
                fixture: None,
                repro: None,
            })?;
        let mut bucket = Bucket::empty();
        let mut at = 0;
        for size in sizes {
            let batch = &self.events[at..at + size];
            let through = batch[batch.len() - 1].offset;
            let before = state.clone();
            let (next, _, next_bucket) =
                fold_events(g, &self.stream, &state, batch, through, bucket).map_err(|f| {
                    Counterexample {
                        what: format!(
                            "the fold of offsets {}..={through} failed: {}",
                            batch[0].offset, f.message
                        ),
                        state_before: Some(before.clone()),
                        fixture: Some(fixture(batch)),
                        repro: Some(self.repro(&before, batch, through)),
                    }
                })?;
            state = next;
            bucket = next_bucket;
            at += size;
            if let Some(t) = trace.as_deref_mut() {
                t.push((at, before, parse(&state)));
            }
        }
        Ok(End {
            state: parse(&state),
            keys: bucket.writes().clone(),
        })
    }

    /// The first batch of `sizes` whose end differs from folding one event
    /// at a time, as a counterexample.
    fn locate(&self, sizes: &[usize], split: usize) -> Counterexample {
        let mut cut = Vec::new();
        let mut single = Vec::new();
        let folded = self
            .fold(sizes, Some(&mut cut))
            .and_then(|_| self.fold(&vec![1; self.events.len()], Some(&mut single)));
        if let Err(c) = folded {
            return c;
        }
        let what = format!(
            "the state depends on how the batches are cut: cut #{split} (batch sizes {sizes:?}; #0 is whole batches, the others come from seed {}) ends elsewhere than one event at a time",
            self.seed
        );
        for (i, (end, before, state)) in cut.iter().enumerate() {
            let alone = &single[end - 1].2;
            if state != alone {
                let start = end - sizes[i];
                let batch = &self.events[start..*end];
                let through = batch[batch.len() - 1].offset;
                return Counterexample {
                    what: format!(
                        "{what}; the batch of offsets {}..={through} ends in\n  {state}\nwhere one event at a time ends in\n  {alone}",
                        batch[0].offset
                    ),
                    state_before: Some(before.clone()),
                    fixture: Some(fixture(batch)),
                    repro: Some(self.repro(before, batch, through)),
                };
            }
        }
        Counterexample {
            what: format!("{what} (in its keyed state)"),
            state_before: None,
            fixture: None,
            repro: None,
        }
    }

    fn repro(&self, state: &str, batch: &[Event], through: u64) -> String {
        let batch = super::runtime::Batch {
            stream: self.stream.clone(),
            events: super::wake::batch_events(batch),
            scanned_through_offset: through,
        };
        super::wave::fold_command(self.component_path, state, &batch, None)
    }
}

fn parse(state: &str) -> Value {
    serde_json::from_str(state).unwrap_or_else(|_| Value::String(state.to_string()))
}

fn fixture(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| serde_json::to_string(e).expect("events serialize"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_cuts_cover_every_event_once_and_a_seed_repeats_them() {
        for n in [1, 2, 7, 1000, 2500] {
            let mut cuts = Cuts(7);
            let sizes = cuts.sizes(n);
            assert_eq!(sizes.iter().sum::<usize>(), n);
            assert!(sizes.iter().all(|s| (1..=BATCH_MAX).contains(s)));
            assert_eq!(Cuts(7).sizes(n), sizes, "seeded");
        }
        let a: Vec<Vec<usize>> = (0..5).map(|_| Cuts(1).sizes(10)).collect();
        let mut c = Cuts(1);
        let b: Vec<Vec<usize>> = (0..5).map(|_| c.sizes(10)).collect();
        assert!(a.iter().all(|s| *s == a[0]));
        assert!(
            b.iter().any(|s| *s != b[0]),
            "successive cuts differ: {b:?}"
        );
    }
}
