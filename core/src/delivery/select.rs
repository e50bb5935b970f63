//! The pure selection of the next batch from the log: matching events up
//! to a count and byte bound, non-matching ones passed over.

use serde_json::Value;

use super::{Failure, BATCH_BYTES_MAX};
use crate::filter::CompiledFilter;
use crate::stream::Event;

/// The events chosen for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// Matching events to deliver, in order.
    pub events: Vec<Event>,
    /// Bytes of the matching events as stored.
    pub bytes: usize,
    /// The cursor after a successful delivery of `events`.
    pub through: u64,
}

/// Chooses the next batch from stored events after the cursor: matching
/// events up to `limit` events and about [`BATCH_BYTES_MAX`] bytes; events
/// that do not match are passed over (they still advance the cursor). A
/// condition that throws ends the batch before that event, or, when it is the
/// first event to consider, is the attempt's failure.
pub fn select_batch(
    key: &str,
    stored: &[(u64, String)],
    filter: &CompiledFilter,
    limit: usize,
    cursor: u64,
) -> Result<Selection, Failure> {
    let mut selection = Selection {
        events: Vec::new(),
        bytes: 0,
        through: cursor,
    };
    for (offset, body) in stored {
        assert!(
            *offset > selection.through,
            "invariant cursor-monotonic: {key:?} read offset {offset} after offset {}",
            selection.through
        );
        let value: Value = serde_json::from_str(body).map_err(|e| Failure {
            message: format!("the stored event at offset {offset} is not JSON: {e}"),
            retryable: true,
            single_offset: Some(*offset),
            at_offset: None,
            detail: None,
            filter: false,
            retry_after_ms: None,
        })?;
        let event: Event = serde_json::from_value(value.clone()).map_err(|e| Failure {
            message: format!("the stored event at offset {offset} is malformed: {e}"),
            retryable: true,
            single_offset: Some(*offset),
            at_offset: None,
            detail: None,
            filter: false,
            retry_after_ms: None,
        })?;
        let matches = match filter.matches(&event.event_type, &event.payload, &value) {
            Ok(m) => m,
            Err(e) if selection.events.is_empty() && selection.through == cursor => {
                return Err(Failure {
                    // The same condition on the same event fails again
                    // (an evaluation is deterministic): halt at once.
                    retryable: false,
                    message: format!(
                        "subscription {key:?} filter condition failed on offset {offset}: {e}"
                    ),
                    single_offset: Some(*offset),
                    at_offset: None,
                    detail: None,
                    filter: true,
                    retry_after_ms: None,
                });
            }
            // Deliver what precedes it; the next attempt starts here.
            Err(_) => return Ok(selection),
        };
        if matches {
            if !selection.events.is_empty()
                && (selection.events.len() >= limit
                    || selection.bytes + body.len() > BATCH_BYTES_MAX)
            {
                return Ok(selection);
            }
            selection.bytes += body.len();
            selection.events.push(event);
        }
        selection.through = *offset;
    }
    Ok(selection)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscription::Filter;
    use serde_json::json;

    fn stored(offset: u64, t: &str, payload: Value) -> (u64, String) {
        let e = json!({"offset": offset, "type": t, "payload": payload, "createdAt": "2026-11-30T00:00:00.000Z"});
        (offset, e.to_string())
    }

    fn log() -> Vec<(u64, String)> {
        vec![
            stored(3, "a", json!({"n": 1})),
            stored(4, "b", json!({"n": 2})),
            stored(5, "a", json!({"n": 3})),
            stored(6, "a", json!({"n": "x"})),
        ]
    }

    #[test]
    fn non_matching_events_advance_the_cursor() {
        let f = CompiledFilter::new(
            Some(&Filter {
                event_types: Some(vec!["b".into()]),
                jsonata_condition: None,
            }),
            false,
            Default::default(),
        )
        .unwrap();
        let s = select_batch("k", &log(), &f, 1000, 2).unwrap();
        assert_eq!(
            s.events.iter().map(|e| e.offset).collect::<Vec<_>>(),
            vec![4]
        );
        assert_eq!(s.through, 6);
        let none = CompiledFilter::new(
            Some(&Filter {
                event_types: Some(vec!["zzz".into()]),
                jsonata_condition: None,
            }),
            false,
            Default::default(),
        )
        .unwrap();
        let s = select_batch("k", &log(), &none, 1000, 2).unwrap();
        assert!(s.events.is_empty());
        assert_eq!(s.through, 6);
    }

    #[test]
    fn isolate_mode_takes_one_matching_event() {
        let s = select_batch("k", &log(), &CompiledFilter::default(), 1, 2).unwrap();
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.through, 3);
    }

    #[test]
    fn a_throwing_condition_stops_before_the_event_or_fails_on_it() {
        let f = CompiledFilter::new(
            Some(&Filter {
                event_types: None,
                jsonata_condition: Some("$number(payload.n) > 0".into()),
            }),
            false,
            Default::default(),
        )
        .unwrap();
        let s = select_batch("k", &log(), &f, 1000, 2).unwrap();
        assert_eq!(s.events.len(), 3);
        assert_eq!(s.through, 5, "never past the failing event");
        let err = select_batch("k", &log()[3..], &f, 1000, 5).unwrap_err();
        assert!(
            err.message
                .starts_with("subscription \"k\" filter condition failed on offset 6"),
            "{}",
            err.message
        );
        assert_eq!(err.single_offset, Some(6));
    }

    #[test]
    fn drop_audits_are_never_selected_for_copies() {
        let audit = stored(
            7,
            "events.iterate.com/stream/error-occurred",
            json!({"reason": "copy-dropped"}),
        );
        let f = CompiledFilter::new(None, true, Default::default()).unwrap();
        let s = select_batch("k", std::slice::from_ref(&audit), &f, 1000, 6).unwrap();
        assert!(s.events.is_empty());
        assert_eq!(s.through, 7);
        let s = select_batch(
            "k",
            &[audit],
            &CompiledFilter::new(None, false, Default::default()).unwrap(),
            1000,
            6,
        )
        .unwrap();
        assert_eq!(s.events.len(), 1);
    }
}
