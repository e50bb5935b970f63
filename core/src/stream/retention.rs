//! Retention: a stream's bounds by age and count (`:configureRetention`,
//! a `retention-configured` event), and which events from the front of its
//! log go next (a `events-removed` event, whose commit deletes them).
//!
//! Pure: the host reads the front of the log, the floor (the lowest cursor
//! of a durable subscription, the lowest processor checkpoint) and the
//! clock, and [`removal`] decides.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::error::Error;

/// Most events one removal takes: the host removes a long backlog in
/// commits of this many, each its own `events-removed` event (a commit of
/// 2,000 deletions holds the writer for milliseconds, not tens of them).
pub const REMOVAL_EVENTS_MAX: usize = 2_000;

/// A stream's retention bounds; at least one is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// Events older than this many milliseconds go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_ms: Option<u64>,
    /// Beyond this many stored events, the oldest go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_events: Option<u64>,
}

impl Retention {
    /// The bounds a `retention-configured` payload (or a
    /// `:configureRetention` body) sets: `None` when both are absent or
    /// `null` (retention removed). Each must be a whole number of at least
    /// 1; the error names the field and the value.
    pub fn from_payload(
        at: &str,
        payload: &Map<String, Value>,
    ) -> Result<Option<Retention>, Error> {
        for key in payload.keys() {
            if key != "maxAgeMs" && key != "maxEvents" {
                return Err(Error::invalid(format!(
                    "{at}.{key}: unknown field (expected maxAgeMs and/or maxEvents)"
                )));
            }
        }
        let bound = |key: &str| -> Result<Option<u64>, Error> {
            match payload.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) if n >= 1 && n <= i64::MAX as u64 => Ok(Some(n)),
                    _ => Err(Error::invalid(format!(
                        "{at}.{key} is {v}: it must be a whole number of at least 1 (or null to \
                         remove the bound)"
                    ))),
                },
            }
        };
        let retention = Retention {
            max_age_ms: bound("maxAgeMs")?,
            max_events: bound("maxEvents")?,
        };
        Ok((retention.max_age_ms.is_some() || retention.max_events.is_some()).then_some(retention))
    }
}

/// What an `events-removed` event says: every stored event through
/// `through_offset` is gone (`count` of them), and `digest` chains the
/// previous removal's digest with the removed events' stored bodies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventsRemoved {
    /// The stream's first offset when the removal was planned: a removal
    /// planned against another front (one committed since) is refused.
    pub from_offset: u64,
    /// The last offset removed: the stream's first offset is the next.
    pub through_offset: u64,
    /// Stored events removed.
    pub count: u64,
    /// SHA-256 (hex) of the previous removal's digest (or nothing) and
    /// each removed event's stored body, in offset order.
    pub digest: String,
}

impl EventsRemoved {
    /// Reads an `events-removed` payload.
    pub fn from_payload(at: &str, payload: &Map<String, Value>) -> Result<EventsRemoved, Error> {
        serde_json::from_value(Value::Object(payload.clone()))
            .map_err(|e| Error::invalid(format!("{at}: {e}")))
    }
}

/// One stored event at the front of the log, as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Front {
    /// Its offset.
    pub offset: u64,
    /// Its `createdAt` in milliseconds since the epoch.
    pub created_at_ms: i64,
}

/// Which events go next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removal {
    /// The last offset to remove.
    pub through_offset: u64,
    /// How many stored events that is (a prefix of the front given).
    pub count: usize,
}

/// The prefix of `front` (the log's oldest stored events, in order) that
/// `retention` removes now: those beyond `max_events` of the `stored`
/// events, and those older than `max_age_ms` at `now_ms`, but none past
/// `floor` (the lowest offset a durable subscription or a processor still
/// needs everything up to) and at most [`REMOVAL_EVENTS_MAX`]. `None`:
/// nothing goes.
pub fn removal(
    retention: &Retention,
    front: &[Front],
    stored: u64,
    now_ms: i64,
    floor: u64,
) -> Option<Removal> {
    let by_count = retention
        .max_events
        .map_or(0, |max| stored.saturating_sub(max) as usize);
    let by_age = retention.max_age_ms.map_or(0, |age| {
        let cut = now_ms.saturating_sub(age.min(i64::MAX as u64) as i64);
        front.iter().take_while(|e| e.created_at_ms < cut).count()
    });
    let n = by_count
        .max(by_age)
        .min(front.len())
        .min(REMOVAL_EVENTS_MAX);
    let n = front[..n].iter().take_while(|e| e.offset <= floor).count();
    (n > 0).then(|| Removal {
        through_offset: front[n - 1].offset,
        count: n,
    })
}

/// `410 offset-gone` for a read after `after_offset` when retention removed
/// the events there (`first_offset`: the stream's first offset). A read
/// from the start (`after_offset` 0) reads what is kept.
pub fn check_read(first_offset: u64, after_offset: u64) -> Result<(), Error> {
    if after_offset > 0 && after_offset + 1 < first_offset {
        return Err(Error::gone(
            "offset-gone",
            format!(
                "offset {} is gone: retention removed this stream's events before offset \
                 {first_offset} (read after {} or later, or from the start)",
                after_offset + 1,
                first_offset - 1
            ),
        ));
    }
    Ok(())
}

/// The digest an `events-removed` event carries: SHA-256 over the previous
/// removal's digest and the removed events' stored bodies, each preceded by
/// its length (so no two sequences of bodies chain alike).
pub fn chain_digest<'a>(previous: &str, bodies: impl IntoIterator<Item = &'a str>) -> String {
    let mut h = Sha256::new();
    h.update((previous.len() as u64).to_be_bytes());
    h.update(previous.as_bytes());
    for body in bodies {
        h.update((body.len() as u64).to_be_bytes());
        h.update(body.as_bytes());
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn front(n: u64, first_ms: i64) -> Vec<Front> {
        (0..n)
            .map(|i| Front {
                offset: 10 + i,
                created_at_ms: first_ms + i as i64 * 1000,
            })
            .collect()
    }

    fn bounds(v: Value) -> Result<Option<Retention>, Error> {
        Retention::from_payload("body", v.as_object().unwrap())
    }

    #[test]
    fn bounds_must_be_whole_numbers_of_at_least_one_and_null_removes_them() {
        assert_eq!(
            bounds(json!({"maxEvents": 5})).unwrap(),
            Some(Retention {
                max_age_ms: None,
                max_events: Some(5)
            })
        );
        assert_eq!(
            bounds(json!({"maxEvents": null, "maxAgeMs": null})).unwrap(),
            None
        );
        assert_eq!(bounds(json!({})).unwrap(), None);
        for (body, named) in [
            (json!({"maxEvents": 0}), "body.maxEvents is 0"),
            (json!({"maxAgeMs": -5}), "body.maxAgeMs is -5"),
            (json!({"maxAgeMs": 1.5}), "body.maxAgeMs is 1.5"),
            (json!({"maxEvents": "10"}), "body.maxEvents is \"10\""),
            (json!({"maxCount": 3}), "body.maxCount: unknown field"),
        ] {
            let e = bounds(body).unwrap_err();
            assert!(e.message.contains(named), "{}", e.message);
        }
    }

    #[test]
    fn the_count_bound_removes_the_oldest_beyond_it() {
        let r = Retention {
            max_age_ms: None,
            max_events: Some(3),
        };
        let f = front(5, 0);
        assert_eq!(
            removal(&r, &f, 5, 0, u64::MAX),
            Some(Removal {
                through_offset: 11,
                count: 2
            })
        );
        assert_eq!(removal(&r, &f[..3], 3, 0, u64::MAX), None);
    }

    #[test]
    fn the_age_bound_removes_what_is_older_and_the_larger_cut_wins() {
        let r = Retention {
            max_age_ms: Some(2500),
            max_events: Some(4),
        };
        // Created at 0, 1000, ... 4000; at 5000 what is older than 2500 ms
        // (0, 1000, 2000) goes: more than the count bound's one.
        let f = front(5, 0);
        assert_eq!(
            removal(&r, &f, 5, 5000, u64::MAX),
            Some(Removal {
                through_offset: 12,
                count: 3
            })
        );
    }

    #[test]
    fn nothing_goes_past_the_floor_and_a_removal_is_bounded() {
        let r = Retention {
            max_age_ms: None,
            max_events: Some(1),
        };
        let f = front(5, 0);
        assert_eq!(
            removal(&r, &f, 5, 0, 11),
            Some(Removal {
                through_offset: 11,
                count: 2
            })
        );
        assert_eq!(removal(&r, &f, 5, 0, 9), None);
        let long = front(REMOVAL_EVENTS_MAX as u64 + 50, 0);
        let cut = removal(&r, &long, long.len() as u64, 0, u64::MAX).unwrap();
        assert_eq!(cut.count, REMOVAL_EVENTS_MAX);
    }

    #[test]
    fn the_digest_chains_and_tells_body_boundaries_apart() {
        let a = chain_digest("", ["ab", "c"]);
        assert_ne!(a, chain_digest("", ["a", "bc"]));
        assert_ne!(chain_digest(&a, ["x"]), chain_digest("", ["x"]));
        assert_eq!(a.len(), 64);
    }
}
