//! Turns on the cores for long guest calls on lowered threads (`SCHED_IDLE`
//! guest threads, the nice-10 compile threads): at most one call per core
//! runs past its first time slice at once, the others wait, not runnable,
//! in line, and a call that holds a turn hands it on at each slice while
//! another waits.
//!
//! Why: such threads run on CPU time no other thread wants, but when more
//! of them are runnable than there are cores, the kernel's wakeups of the
//! normal threads (requests, appends, commits) wait now and then anyway:
//! on this machine kind a 1 ms sleep overshot by 0.13 ms at p99.9 beside
//! two spinning `SCHED_IDLE` threads (one per core), 1.4 ms beside four and
//! 3.9 ms beside eight. Eight ITX calls that spin until their timeout were
//! eight runnable threads; now they are two, taking turns. What a call
//! waits in line is not its CPU time, so its timeout (which counts CPU time
//! on these threads) is not spent waiting.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

/// The turns of this process: one per core (guests of every runtime in a
/// process share the machine's cores).
pub(crate) static TURNS: LazyLock<Turns> =
    LazyLock::new(|| Turns::new(std::thread::available_parallelism().map_or(2, |n| n.get())));

thread_local! {
    /// Whether this thread holds a turn (a call nested in a call that
    /// holds one never waits for a second).
    static HOLDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A fair (first come, first served) count of turns. A turn handed back
/// goes straight to the first call in line, which alone is woken: the
/// others stay asleep (woken all at once, they would all be runnable
/// again, which is what the turns are for avoiding).
pub(crate) struct Turns {
    capacity: usize,
    state: Mutex<Line>,
    /// Calls waiting in line (read without the lock at every slice).
    waiting: AtomicUsize,
}

#[derive(Default)]
struct Line {
    taken: usize,
    /// The calls waiting, oldest first.
    queue: VecDeque<Arc<Waiter>>,
}

struct Waiter {
    thread: std::thread::Thread,
    /// Set when a turn was handed to it.
    granted: AtomicBool,
}

/// A turn held; handed on (or back) when dropped.
pub(crate) struct Turn<'a> {
    turns: &'a Turns,
    thread: std::thread::ThreadId,
}

impl Turns {
    pub(crate) fn new(capacity: usize) -> Turns {
        Turns {
            capacity: capacity.max(1),
            state: Mutex::new(Line::default()),
            waiting: AtomicUsize::new(0),
        }
    }

    fn line(&self) -> std::sync::MutexGuard<'_, Line> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits in line for a turn; `None` when this thread holds one already.
    pub(crate) fn take(&self) -> Option<Turn<'_>> {
        if HOLDING.with(std::cell::Cell::get) {
            return None;
        }
        let mut line = self.line();
        if line.queue.is_empty() && line.taken < self.capacity {
            line.taken += 1;
        } else {
            let me = Arc::new(Waiter {
                thread: std::thread::current(),
                granted: AtomicBool::new(false),
            });
            line.queue.push_back(me.clone());
            self.waiting.fetch_add(1, Ordering::AcqRel);
            drop(line);
            while !me.granted.load(Ordering::Acquire) {
                std::thread::park();
            }
        }
        HOLDING.with(|h| h.set(true));
        Some(Turn {
            turns: self,
            thread: std::thread::current().id(),
        })
    }

    /// Whether a call waits in line.
    pub(crate) fn contended(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// Calls waiting in line now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Turns held now.
    #[cfg(test)]
    fn taken(&self) -> usize {
        self.line().taken
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if std::thread::current().id() == self.thread {
            HOLDING.with(|h| h.set(false));
        }
        let mut line = self.turns.line();
        match line.queue.pop_front() {
            // Handed on: still taken.
            Some(next) => {
                self.turns.waiting.fetch_sub(1, Ordering::AcqRel);
                drop(line);
                next.granted.store(true, Ordering::Release);
                next.thread.unpark();
            }
            None => line.taken -= 1,
        }
    }
}

/// A call's turn as its store holds it: taken at the call's first slice
/// past the start, handed on at each later slice while another call waits.
#[derive(Default)]
pub(crate) struct Slices {
    turn: Option<Turn<'static>>,
}

impl Slices {
    /// At the end of a time slice: takes a turn (waiting in line) if the
    /// call holds none, or hands it on and waits in line again if another
    /// call waits.
    pub(crate) fn sliced(&mut self) {
        match &self.turn {
            None => self.turn = TURNS.take(),
            Some(_) if TURNS.contended() => {
                self.turn = None;
                self.turn = TURNS.take();
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// `n` threads that each take a turn, hold it a while and hand it back,
    /// in line one after another behind a turn the caller holds (which it
    /// then hands back): the most turns held at once, and the order the
    /// threads got theirs in.
    fn line_up(capacity: usize, n: usize) -> (usize, Vec<usize>) {
        let turns: &'static Turns = Box::leak(Box::new(Turns::new(capacity)));
        let held: Vec<Turn<'static>> = (0..capacity).map(|_| held_elsewhere(turns)).collect();
        let most = Arc::new(AtomicUsize::new(0));
        let order = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let (most, order) = (most.clone(), order.clone());
                let t = std::thread::spawn(move || {
                    let turn = turns.take().expect("a turn");
                    most.fetch_max(turns.taken(), Ordering::AcqRel);
                    order.lock().unwrap().push(i);
                    // Held a while (others come and wait meanwhile).
                    for _ in 0..200 {
                        std::thread::yield_now();
                    }
                    drop(turn);
                });
                let deadline = Instant::now() + Duration::from_secs(10);
                while turns.waiting.load(Ordering::Acquire) < i + 1 {
                    assert!(Instant::now() < deadline, "thread {i} never got in line");
                    std::thread::yield_now();
                }
                t
            })
            .collect();
        drop(held);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(turns.taken(), 0);
        assert!(!turns.contended());
        let order = order.lock().unwrap().clone();
        (most.load(Ordering::Acquire), order)
    }

    /// A turn taken on a thread of its own (so this thread may take more).
    fn held_elsewhere(turns: &'static Turns) -> Turn<'static> {
        std::thread::spawn(move || turns.take().expect("a free turn"))
            .join()
            .unwrap()
    }

    #[test]
    fn no_more_turns_are_held_at_once_than_there_are() {
        let (most, order) = line_up(2, 8);
        assert!(most <= 2, "{most} turns held at once");
        assert_eq!(order.len(), 8);
    }

    #[test]
    fn turns_go_in_the_order_the_calls_came() {
        let (_, order) = line_up(1, 6);
        assert_eq!(order, vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_thread_that_holds_a_turn_never_waits_for_a_second() {
        let turns: &'static Turns = Box::leak(Box::new(Turns::new(1)));
        let turn = turns.take().expect("a free turn");
        assert!(turns.take().is_none());
        drop(turn);
        assert!(turns.take().is_some());
    }
}
