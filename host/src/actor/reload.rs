//! Whether and when a stream actor loads its stream again: at its first
//! use, after a storage failure (with backoff, so stalled deliveries resume
//! without a request), after its lease lapsed or another host took the
//! stream. A sub-machine of the actor's core ([`super::core::ActorCore`]):
//! pure, the caller passes the time.

/// The first wait after failures in a row, ms (the first failure reloads at once).
const BACKOFF_BASE_MS: u64 = 50;
/// The longest wait between reloads, ms.
const BACKOFF_MAX_MS: u64 = 5_000;

/// Wait before the next load after `failures` storage failures (failed
/// loads or writes) in a row: 0, 50, 100, 200 ... 5000 ms.
fn backoff_ms(failures: u32) -> u64 {
    match failures {
        0 | 1 => 0,
        n => BACKOFF_BASE_MS
            .saturating_mul(1 << (n - 2).min(16))
            .min(BACKOFF_MAX_MS),
    }
}

/// The reload state of one stream actor.
#[derive(Debug)]
pub(super) struct Reload {
    /// The core's state may not be the log's: load before serving.
    needed: bool,
    /// Storage failures (loads or writes) since the last committed write.
    failures: u32,
    /// When to load with no request after a failure (`None`: at the next
    /// use), ms since the epoch.
    at_ms: Option<i64>,
}

impl Reload {
    /// A new actor: it loads at its first use.
    pub(super) fn new() -> Reload {
        Reload {
            needed: true,
            failures: 0,
            at_ms: None,
        }
    }

    /// Whether the stream must be loaded before the core serves.
    pub(super) fn needed(&self) -> bool {
        self.needed
    }

    /// The state may be behind the log (a lapsed lease, another owner, a
    /// refused plan): load at the next use.
    pub(super) fn request(&mut self) {
        self.needed = true;
    }

    /// Whether a load scheduled after a failure is due at `now_ms`.
    pub(super) fn due(&self, now_ms: i64) -> bool {
        self.needed && self.at_ms.is_some_and(|at| at <= now_ms)
    }

    /// When the core must wake for a scheduled load, ms since the epoch.
    pub(super) fn timer_ms(&self) -> Option<i64> {
        self.at_ms.filter(|_| self.needed)
    }

    /// A load began: it is the one a backoff waited for, so only its own
    /// failure schedules another (a stream owned elsewhere or a lost lease
    /// schedules none: a request, or the lease's return, loads again).
    pub(super) fn started(&mut self) {
        self.at_ms = None;
    }

    /// A load took its result over: the core's state is the log's.
    pub(super) fn loaded(&mut self) {
        self.needed = false;
        self.at_ms = None;
    }

    /// A load or write failed at `now_ms`: the stream is loaded again
    /// after the backoff (at once after a first failure). The wait, ms.
    pub(super) fn failed(&mut self, now_ms: i64) -> u64 {
        self.failures = self.failures.saturating_add(1);
        let wait = backoff_ms(self.failures);
        self.needed = true;
        self.at_ms = Some(now_ms + wait as i64);
        wait
    }

    /// A write committed: the next failure starts the backoff again.
    pub(super) fn committed(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reloads_start_at_once_then_back_off_to_a_bound() {
        let waits: Vec<u64> = (1..=10).map(backoff_ms).collect();
        assert_eq!(
            waits,
            vec![0, 50, 100, 200, 400, 800, 1600, 3200, 5000, 5000]
        );
        assert_eq!(backoff_ms(u32::MAX), BACKOFF_MAX_MS);
    }

    #[test]
    fn a_new_actor_loads_at_its_first_use_with_no_timer() {
        let r = Reload::new();
        assert!(r.needed());
        assert!(!r.due(i64::MAX), "nothing scheduled: a request loads");
        assert_eq!(r.timer_ms(), None);
    }

    #[test]
    fn failures_schedule_loads_further_apart_until_a_write_commits() {
        let mut r = Reload::new();
        assert_eq!(r.failed(1_000), 0);
        assert!(r.due(1_000), "the first failure reloads at once");
        r.started();
        assert_eq!(r.timer_ms(), None, "the load the backoff waited for runs");
        assert_eq!(r.failed(1_000), 50);
        assert_eq!(r.timer_ms(), Some(1_050));
        assert!(!r.due(1_049) && r.due(1_050));
        r.started();
        assert_eq!(r.failed(1_050), 100);
        r.loaded();
        assert!(!r.needed() && r.timer_ms().is_none() && !r.due(i64::MAX));
        // Loaded, but no write committed yet: the next failure waits longer.
        assert_eq!(r.failed(2_000), 200);
        r.loaded();
        r.committed();
        assert_eq!(
            r.failed(3_000),
            0,
            "a committed write starts the backoff again"
        );
    }

    #[test]
    fn a_requested_load_waits_for_a_use_not_a_timer() {
        let mut r = Reload::new();
        r.loaded();
        r.request();
        assert!(r.needed());
        assert_eq!(r.timer_ms(), None);
        assert!(!r.due(i64::MAX));
        // A failure's timer belongs to a needed load only.
        r.failed(10);
        r.loaded();
        assert_eq!(r.timer_ms(), None);
    }
}
