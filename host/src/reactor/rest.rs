//! Reactors that time out again and again rest: pure, the clock an
//! argument. A reactor call that runs to its timeout costs its project a
//! second of a core and fails anyway; after [`TIMEOUTS_BEFORE_REST`] in a
//! row, one version of a component (its digest, in its project) is not
//! called for a while: the events it would run for are refused at once
//! with `503 reactor-unavailable` and a `retry-after` of the rest left.
//! After the rest one call is tried again: a timeout doubles the rest (up
//! to [`REST_MS_MAX`]), anything else ends it.

use std::collections::HashMap;

/// Timeouts in a row after which a reactor rests.
pub const TIMEOUTS_BEFORE_REST: u32 = 2;
/// The first rest; each timeout after it doubles it.
pub const REST_MS_FIRST: i64 = 2_000;
/// The longest rest.
pub const REST_MS_MAX: i64 = 60_000;

/// The timeouts in a row of the reactor versions that have some, by
/// (project, digest).
#[derive(Debug, Default)]
pub struct Rests {
    by: HashMap<(String, String), Timeouts>,
}

#[derive(Debug, Clone, Copy)]
struct Timeouts {
    in_a_row: u32,
    rest_until_ms: i64,
}

/// A reactor resting: how many calls in a row timed out, and until when
/// it rests (ms since the epoch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resting {
    pub timeouts: u32,
    pub until_ms: i64,
}

impl Rests {
    /// Whether the version `digest` of a reactor of `project` may be called
    /// at `now_ms`.
    pub fn admit(&self, project: &str, digest: &str, now_ms: i64) -> Result<(), Resting> {
        if self.by.is_empty() {
            return Ok(());
        }
        match self.by.get(&(project.to_string(), digest.to_string())) {
            Some(t) if now_ms < t.rest_until_ms => Err(Resting {
                timeouts: t.in_a_row,
                until_ms: t.rest_until_ms,
            }),
            _ => Ok(()),
        }
    }

    /// A call ran to its timeout at `now_ms`.
    pub fn timed_out(&mut self, project: &str, digest: &str, now_ms: i64) {
        let t = self
            .by
            .entry((project.to_string(), digest.to_string()))
            .or_insert(Timeouts {
                in_a_row: 0,
                rest_until_ms: 0,
            });
        t.in_a_row = t.in_a_row.saturating_add(1);
        if t.in_a_row >= TIMEOUTS_BEFORE_REST {
            let doublings = (t.in_a_row - TIMEOUTS_BEFORE_REST).min(16);
            let rest = REST_MS_FIRST
                .saturating_mul(1 << doublings)
                .min(REST_MS_MAX);
            t.rest_until_ms = now_ms.saturating_add(rest);
        }
    }

    /// A call ended before its timeout (whatever it answered): the reactor
    /// is well again.
    pub fn ran(&mut self, project: &str, digest: &str) {
        if !self.by.is_empty() {
            self.by.remove(&(project.to_string(), digest.to_string()));
        }
    }

    /// Whether no reactor version has timeouts in a row.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.by.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reactor_rests_after_timeouts_in_a_row_longer_each_time_and_is_well_after_a_call() {
        let mut r = Rests::default();
        assert!(r.admit("p", "d", 0).is_ok());
        r.timed_out("p", "d", 1_000);
        assert!(
            r.admit("p", "d", 1_000).is_ok(),
            "one timeout is no pattern"
        );
        r.timed_out("p", "d", 2_000);
        assert_eq!(
            r.admit("p", "d", 2_001),
            Err(Resting {
                timeouts: 2,
                until_ms: 4_000
            })
        );
        assert!(r.admit("p", "other", 2_001).is_ok(), "another version");
        assert!(r.admit("q", "d", 2_001).is_ok(), "another project");
        // After its rest one call is tried; a timeout doubles the rest.
        assert!(r.admit("p", "d", 4_000).is_ok());
        r.timed_out("p", "d", 5_000);
        assert_eq!(r.admit("p", "d", 5_000).unwrap_err().until_ms, 9_000);
        for i in 0..40 {
            r.timed_out("p", "d", 10_000 + i);
        }
        assert_eq!(
            r.admit("p", "d", 10_039).unwrap_err().until_ms,
            10_039 + REST_MS_MAX
        );
        // A call that ends in time ends it.
        r.ran("p", "d");
        assert!(r.admit("p", "d", 10_040).is_ok());
        assert!(r.is_empty());
    }
}
