//! Instances made ahead of their use. Instantiating a component built with
//! a language runtime (CPython's component links a dozen core modules to
//! one another, function by function) costs milliseconds, more than the
//! fold it serves; so after such a component's call, one background thread
//! makes its next instance, and the next call takes that one instead of
//! making its own. Each instance still serves one call only: a call's
//! environment (its clock, random seeds, keyed state, deadline) is given to
//! the instance when the call takes it, and an instance whose making read
//! the clock or random bytes is never kept (the runtime checks).
//!
//! What this module keeps is opaque to it (the runtime's store and
//! instance): at most [`PARKED_MAX`] instances, one per component digest,
//! the oldest dropped first.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

/// Instances kept made ahead, all components together: each holds a slot
/// of the instance pool and its memory (a Python runtime's: about 13 MiB).
pub const PARKED_MAX: usize = 8;

/// A making of an instance, run on the background thread; `None` when it
/// failed or is not to be kept.
type Making<S> = Box<dyn FnOnce() -> Option<S> + Send>;

/// A making of `digest`'s instance, queued for the background thread.
type Job<S> = (String, Making<S>);

/// The background thread's queue.
type Queue<S> = Sender<Job<S>>;

/// The instances made ahead, by component digest, and the thread that
/// makes them.
pub struct Ahead<S> {
    parked: Mutex<VecDeque<(String, S)>>,
    /// Digests whose next instance is queued, being made or parked: one
    /// at a time per digest.
    pending: Mutex<HashSet<String>>,
    queue: Mutex<Option<Queue<S>>>,
    /// Calls served by an instance made ahead.
    served: AtomicU64,
    /// Counts the background thread's finished jobs, for [`Ahead::wait_for`].
    finished: (Mutex<u64>, std::sync::Condvar),
    /// Run first on the background thread (the runtime lowers its
    /// priority: making ahead takes the CPU that requests leave).
    on_start: fn(),
}

impl<S: Send + 'static> Ahead<S> {
    /// `on_start` runs first on the background thread.
    pub fn new(on_start: fn()) -> Arc<Ahead<S>> {
        Arc::new(Ahead {
            parked: Mutex::new(VecDeque::new()),
            pending: Mutex::new(HashSet::new()),
            queue: Mutex::new(None),
            served: AtomicU64::new(0),
            finished: (Mutex::new(0), std::sync::Condvar::new()),
            on_start,
        })
    }

    /// The instance made ahead for `digest`, if one is parked (it is no
    /// longer: each serves one call).
    pub fn take(&self, digest: &str) -> Option<S> {
        let mut parked = self.parked.lock().expect("parked");
        let i = parked.iter().position(|(d, _)| d == digest)?;
        let (_, made) = parked.remove(i)?;
        drop(parked);
        self.pending.lock().expect("pending").remove(digest);
        self.served.fetch_add(1, Ordering::Relaxed);
        Some(made)
    }

    /// Queues `make` for `digest` on the background thread (started on
    /// first use), unless an instance of `digest` is queued, being made or
    /// parked already. What it makes is parked for the next
    /// [`Ahead::take`]; beyond [`PARKED_MAX`] the oldest is dropped.
    pub fn request(
        self: &Arc<Self>,
        digest: &str,
        make: impl FnOnce() -> Option<S> + Send + 'static,
    ) {
        if !self
            .pending
            .lock()
            .expect("pending")
            .insert(digest.to_string())
        {
            return;
        }
        if self.send((digest.to_string(), Box::new(make))).is_err() {
            self.pending.lock().expect("pending").remove(digest);
        }
    }

    /// Sends `job` to the background thread, started on first use; answers
    /// the job back when there is no thread to take it.
    fn send(self: &Arc<Self>, job: Job<S>) -> Result<(), Job<S>> {
        let mut queue = self.queue.lock().expect("queue");
        if queue.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<Job<S>>();
            let ahead = Arc::downgrade(self);
            let on_start = self.on_start;
            let spawned = std::thread::Builder::new()
                .name("streamhost-instances".into())
                .spawn(move || {
                    on_start();
                    while let Ok((digest, make)) = rx.recv() {
                        let made = make();
                        let Some(ahead) = ahead.upgrade() else {
                            return;
                        };
                        ahead.park(digest, made);
                        *ahead.finished.0.lock().expect("finished") += 1;
                        ahead.finished.1.notify_all();
                    }
                });
            match spawned {
                Ok(_) => *queue = Some(tx),
                Err(e) => {
                    tracing::warn!(error = %e, "no thread to make instances ahead on");
                    return Err(job);
                }
            }
        }
        let sent = match queue.as_ref() {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        };
        if sent.is_err() {
            *queue = None;
        }
        sent
    }

    fn park(&self, digest: String, made: Option<S>) {
        let Some(made) = made else {
            self.pending.lock().expect("pending").remove(&digest);
            return;
        };
        let mut parked = self.parked.lock().expect("parked");
        parked.push_back((digest, made));
        let dropped = if parked.len() > PARKED_MAX {
            parked.pop_front()
        } else {
            None
        };
        drop(parked);
        if let Some((digest, made)) = dropped {
            self.pending.lock().expect("pending").remove(&digest);
            drop(made);
        }
    }

    /// Waits until `holds` (asked again after each job of the background
    /// thread ends), for at most `within`; answers whether it holds.
    pub fn wait_for(&self, within: std::time::Duration, holds: impl Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + within;
        loop {
            let seen = *self.finished.0.lock().expect("finished");
            if holds() {
                return true;
            }
            let mut now = self.finished.0.lock().expect("finished");
            while *now == seen {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    drop(now);
                    return holds();
                }
                now = self.finished.1.wait_timeout(now, left).expect("finished").0;
            }
        }
    }

    /// How many instances are parked now.
    pub fn parked(&self) -> usize {
        self.parked.lock().expect("parked").len()
    }

    /// How many calls an instance made ahead has served.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Drops the instances parked under a key `stale` says is stale.
    pub fn forget(&self, stale: impl Fn(&str) -> bool) {
        let mut parked = self.parked.lock().expect("parked");
        let mut dropped = Vec::new();
        parked.retain_mut(|(key, _)| {
            let keep = !stale(key);
            if !keep {
                dropped.push(key.clone());
            }
            keep
        });
        drop(parked);
        let mut pending = self.pending.lock().expect("pending");
        for key in dropped {
            pending.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits for `holds` after the background thread's jobs, at most five seconds.
    fn eventually<S: Send + 'static>(ahead: &Ahead<S>, holds: impl Fn() -> bool) {
        assert!(
            ahead.wait_for(std::time::Duration::from_secs(5), holds),
            "never came to hold"
        );
    }

    #[test]
    fn each_made_instance_serves_one_take_and_one_is_pending_per_digest() {
        let ahead = Ahead::<u32>::new(|| {});
        assert_eq!(ahead.take("a"), None);
        ahead.request("a", || Some(1));
        eventually(&ahead, || ahead.parked() == 1);
        // Parked already: a second request makes nothing.
        ahead.request("a", || Some(2));
        assert_eq!(ahead.take("a"), Some(1));
        assert_eq!(ahead.take("a"), None);
        assert_eq!(ahead.served(), 1);
        // Taken: the next request makes the next one.
        ahead.request("a", || Some(3));
        eventually(&ahead, || ahead.parked() == 1);
        assert_eq!(ahead.take("a"), Some(3));
    }

    #[test]
    fn a_making_that_fails_parks_nothing_and_may_be_asked_again() {
        let ahead = Ahead::<u32>::new(|| {});
        ahead.request("a", || None);
        ahead.request("b", || Some(7));
        eventually(&ahead, || ahead.parked() == 1);
        assert_eq!(ahead.take("a"), None);
        ahead.request("a", || Some(8));
        eventually(&ahead, || ahead.parked() == 2);
        assert_eq!(ahead.take("a"), Some(8));
        assert_eq!(ahead.take("b"), Some(7));
    }

    #[test]
    fn beyond_the_bound_the_oldest_instance_is_dropped() {
        let ahead = Ahead::<usize>::new(|| {});
        for i in 0..PARKED_MAX {
            ahead.request(&format!("d{i}"), move || Some(i));
            eventually(&ahead, || ahead.parked() == i + 1);
        }
        ahead.request(&format!("d{PARKED_MAX}"), || Some(PARKED_MAX));
        eventually(&ahead, || !ahead.pending.lock().unwrap().contains("d0"));
        assert_eq!(ahead.parked(), PARKED_MAX);
        assert_eq!(ahead.take("d0"), None, "the oldest was dropped");
        assert_eq!(ahead.take(&format!("d{PARKED_MAX}")), Some(PARKED_MAX));
        // The dropped digest may be made again.
        ahead.request("d0", || Some(0));
        eventually(&ahead, || ahead.parked() == PARKED_MAX);
        assert_eq!(ahead.take("d0"), Some(0));
        ahead.forget(|key| key == "d1");
        assert_eq!(ahead.take("d1"), None);
        assert_eq!(ahead.take("d2"), Some(2));
    }
}
