//! `streamhost test`: a processor over fixture events, checked for the
//! properties every fold must have here, besides the author's expected
//! state: no trap; the same state (and keyed state) on a second run; the
//! same state whatever the batch cuts (the wakes cut batches as events
//! arrive; seeded random cuts here). The fold is the wakes' own
//! (`wake::fold_events`), so what passes here folds the same in the server.
//! The first counterexample is reported as a fixture (the state before the
//! batch, the batch's events) with a `wasmtime` command that replays it.
//! `streamhost test A --against B` ([`Against`]) folds the same events
//! through two components and names the first offset where their states
//! or keyed states differ.

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
            // The keys before the batch seed the repro's bucket.
            let keys_before = seeds(&bucket);
            let (next, _, next_bucket) =
                fold_events(g, &self.stream, &state, batch, through, bucket).map_err(|f| {
                    Counterexample {
                        what: format!(
                            "the fold of offsets {}..={through} failed: {}",
                            batch[0].offset, f.message
                        ),
                        state_before: Some(before.clone()),
                        fixture: Some(fixture(batch)),
                        repro: Some(repro(
                            g,
                            self.component_path,
                            &self.stream,
                            &before,
                            &keys_before,
                            batch,
                            through,
                        )),
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
                    repro: Some(repro(
                        &self.guest,
                        self.component_path,
                        &self.stream,
                        before,
                        &[],
                        batch,
                        through,
                    )),
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
}

/// One processor against another over the same fixture events (a port to
/// another language, a new version): each folds the events it consumes,
/// one event per call; after every offset their states and keyed states
/// must be equal. The first offset where they are not is the
/// counterexample.
pub struct Against<'a> {
    pub a: Side<'a>,
    pub b: Side<'a>,
    pub stream: StreamInfo,
}

/// One of the two processors [`Against`] compares.
pub struct Side<'a> {
    pub guest: Guest<'a>,
    /// Where the component file is (named in the report and the repro).
    pub path: &'a str,
    /// The events it consumes, in offset order.
    pub events: &'a [Event],
}

/// A side's fold so far.
struct Folding {
    state: String,
    bucket: Bucket,
}

impl Side<'_> {
    fn start(&self) -> Result<Folding, Counterexample> {
        let g = &self.guest;
        let state = g
            .runtime
            .initial_state(g.component, g.prepared, g.timeout_ms)
            .map_err(|e| plain(format!("{}: initial-state failed: {e}", self.path)))?;
        Ok(Folding {
            state,
            bucket: Bucket::empty(),
        })
    }

    /// Folds `event` (if this side consumes it) into `f`.
    fn fold(
        &self,
        stream: &StreamInfo,
        f: &mut Folding,
        offset: u64,
    ) -> Result<(), Counterexample> {
        let Some(event) = self.events.iter().find(|e| e.offset == offset) else {
            return Ok(());
        };
        let keys_before = seeds(&f.bucket);
        let bucket = std::mem::replace(&mut f.bucket, Bucket::empty());
        let batch = std::slice::from_ref(event);
        let (next, _, bucket) = fold_events(&self.guest, stream, &f.state, batch, offset, bucket)
            .map_err(|e| Counterexample {
            what: format!("{} failed at offset {offset}: {}", self.path, e.message),
            state_before: Some(f.state.clone()),
            fixture: Some(fixture(batch)),
            repro: Some(repro(
                &self.guest,
                self.path,
                stream,
                &f.state,
                &keys_before,
                batch,
                offset,
            )),
        })?;
        f.state = next;
        f.bucket = bucket;
        Ok(())
    }
}

/// The keyed state a fold from an empty bucket left (deletes dropped).
fn kept(bucket: &Bucket) -> std::collections::BTreeMap<&str, &[u8]> {
    bucket
        .writes()
        .iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k.as_str(), v)))
        .collect()
}

fn shown(value: Option<&[u8]>) -> String {
    match value {
        None => "absent".into(),
        Some(v) => match std::str::from_utf8(v) {
            Ok(text) => format!("{text:?}"),
            Err(_) => format!("{} bytes, not UTF-8", v.len()),
        },
    }
}

impl Against<'_> {
    /// Folds both sides offset by offset; answers how many offsets were
    /// compared, or the first where the two differ.
    pub fn run(&self) -> Result<usize, Counterexample> {
        let mut offsets: Vec<u64> = self
            .a
            .events
            .iter()
            .chain(self.b.events)
            .map(|e| e.offset)
            .collect();
        offsets.sort_unstable();
        offsets.dedup();
        let (mut a, mut b) = (self.a.start()?, self.b.start()?);
        if parse(&a.state) != parse(&b.state) {
            return Err(plain(format!(
                "the initial states differ:\n  {} starts from {}\n  {} starts from {}",
                self.a.path, a.state, self.b.path, b.state
            )));
        }
        for &offset in &offsets {
            let (a_before, b_before) = (a.state.clone(), b.state.clone());
            let (a_keys, b_keys) = (seeds(&a.bucket), seeds(&b.bucket));
            self.a.fold(&self.stream, &mut a, offset)?;
            self.b.fold(&self.stream, &mut b, offset)?;
            let event = self
                .a
                .events
                .iter()
                .chain(self.b.events)
                .find(|e| e.offset == offset)
                .expect("an offset of an event");
            let at = format!("at offset {offset} ({})", event.event_type);
            let differs = if parse(&a.state) != parse(&b.state) {
                Some(format!(
                    "{at} the states differ:\n  {} ends in {}\n  {} ends in {}",
                    self.a.path, a.state, self.b.path, b.state
                ))
            } else {
                let (ka, kb) = (kept(&a.bucket), kept(&b.bucket));
                ka.keys()
                    .chain(kb.keys())
                    .find(|k| ka.get(*k) != kb.get(*k))
                    .map(|key| {
                        format!(
                            "{at} the keyed states differ at key {key:?}:\n  {} has {}\n  {} has {}",
                            self.a.path,
                            shown(ka.get(key).copied()),
                            self.b.path,
                            shown(kb.get(key).copied())
                        )
                    })
            };
            if let Some(what) = differs {
                let batch = std::slice::from_ref(event);
                return Err(Counterexample {
                    what,
                    state_before: Some(a_before.clone()),
                    fixture: Some(fixture(batch)),
                    repro: Some(format!(
                        "{}\n   and: {}",
                        repro(
                            &self.a.guest,
                            self.a.path,
                            &self.stream,
                            &a_before,
                            &a_keys,
                            batch,
                            offset
                        ),
                        repro(
                            &self.b.guest,
                            self.b.path,
                            &self.stream,
                            &b_before,
                            &b_keys,
                            batch,
                            offset
                        )
                    )),
                });
            }
        }
        Ok(offsets.len())
    }
}

fn plain(what: String) -> Counterexample {
    Counterexample {
        what,
        state_before: None,
        fixture: None,
        repro: None,
    }
}

/// The keys a bucket holds, to seed a repro's (`-S keyvalue-in-memory-data`).
fn seeds(bucket: &Bucket) -> Vec<(String, Vec<u8>)> {
    kept(bucket)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_vec()))
        .collect()
}

/// The `wasmtime run` command that replays one call: with `-S keyvalue`
/// and the bucket's keys when the component imports `wasi:keyvalue` (as
/// every guest built with the JavaScript or Python SDK does).
fn repro(
    guest: &Guest<'_>,
    path: &str,
    stream: &StreamInfo,
    state: &str,
    keys: &[(String, Vec<u8>)],
    batch: &[Event],
    through: u64,
) -> String {
    let batch = super::runtime::Batch {
        stream: stream.clone(),
        events: super::wake::batch_events(batch),
        scanned_through_offset: through,
    };
    super::wave::fold_command(path, state, &batch, guest.prepared.keyed().then_some(keys))
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
