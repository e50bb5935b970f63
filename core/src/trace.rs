//! W3C trace context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` (and `tracestate`) an append, ingest or ITX call may carry,
//! kept with each event it appends and carried by everything that event
//! causes (copies, deliveries, wakes, effects, the events effects append).
//!
//! A malformed `traceparent` is not an error: it is ignored, as the
//! recommendation asks ([`Trace::parse`] answers `None`).

use serde::{Deserialize, Serialize};

/// The longest `tracestate` kept (the recommendation's bound: 32 members of
/// at most 256 bytes, but vendors "SHOULD" keep it to 512 bytes; longer is
/// dropped, the `traceparent` kept).
pub const TRACESTATE_BYTES_MAX: usize = 512;

/// A trace context: the `traceparent` header's value, and `tracestate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Trace {
    /// `00-<trace-id>-<parent-id>-<flags>`, lowercase hex.
    pub traceparent: String,
    /// Vendor state, as received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Trace {
    /// The context of a `traceparent` (and `tracestate`) header, or `None`
    /// when `traceparent` is malformed: not `version-traceid-parentid-flags`
    /// in lowercase hex, version `ff`, an all-zero id, or version `00` with
    /// anything after the flags. A later version's extra fields are
    /// dropped (the recommendation: parse the first four). A `tracestate`
    /// over [`TRACESTATE_BYTES_MAX`] or with control characters is dropped.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Trace> {
        let t = traceparent.trim();
        let mut parts = t.splitn(5, '-');
        let (version, trace_id, parent_id, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let rest = parts.next();
        if !is_hex(version, 2) || version == "ff" {
            return None;
        }
        if version == "00" && rest.is_some() {
            return None;
        }
        if !is_hex(trace_id, 32) || trace_id.bytes().all(|b| b == b'0') {
            return None;
        }
        if !is_hex(parent_id, 16) || parent_id.bytes().all(|b| b == b'0') {
            return None;
        }
        if !is_hex(flags, 2) {
            return None;
        }
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= TRACESTATE_BYTES_MAX)
            .filter(|s| !s.contains(char::is_control))
            .map(str::to_string);
        Some(Trace {
            traceparent: format!("00-{trace_id}-{parent_id}-{flags}"),
            tracestate,
        })
    }

    /// This context if it is well formed (as [`Trace::parse`] reads it).
    pub fn checked(self) -> Option<Trace> {
        Trace::parse(&self.traceparent, self.tracestate.as_deref())
    }

    /// A new trace: `trace_id` (16 bytes) and `span_id` (8 bytes), sampled.
    pub fn root(trace_id: [u8; 16], span_id: [u8; 8]) -> Trace {
        Trace {
            traceparent: format!("00-{}-{}-01", hex(&trace_id), hex(&span_id)),
            tracestate: None,
        }
    }

    /// The trace id: 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        self.traceparent.get(3..35).unwrap_or_default()
    }

    /// The parent span's id: 16 lowercase hex digits.
    pub fn parent_id(&self) -> &str {
        self.traceparent.get(36..52).unwrap_or_default()
    }

    /// Whether the caller sampled it (flag `01`).
    pub fn sampled(&self) -> bool {
        self.traceparent
            .get(53..55)
            .and_then(|f| u8::from_str_radix(f, 16).ok())
            .is_some_and(|f| f & 1 == 1)
    }

    /// The same trace with `span_id` as its parent: what a span this
    /// context parents hands on to what it causes.
    pub fn child(&self, span_id: [u8; 8]) -> Trace {
        let flags = self.traceparent.get(53..55).unwrap_or("01");
        Trace {
            traceparent: format!("00-{}-{}-{flags}", self.trace_id(), hex(&span_id)),
            tracestate: self.tracestate.clone(),
        }
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A span id derived from `parts` (FNV-1a, 64 bits): the after-the-fact
/// trace of an event names each step by what it is (a stream id and an
/// offset, an effect's key), so exporting the same story twice gives the
/// same spans. Never all zero.
pub fn derived_span_id(parts: &[&str]) -> [u8; 8] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain([0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    if h == 0 {
        h = 1;
    }
    h.to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_well_formed_traceparent_is_kept_and_read() {
        let t = Trace::parse(GOOD, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(t.traceparent, GOOD);
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id(), "00f067aa0ba902b7");
        assert!(t.sampled());
        assert_eq!(t.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        let unsampled = Trace::parse(&GOOD.replace("-01", "-00"), None).unwrap();
        assert!(!unsampled.sampled());
    }

    #[test]
    fn a_malformed_traceparent_is_ignored() {
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(Trace::parse(bad, None), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_keeps_its_first_four_fields_and_a_bad_tracestate_is_dropped() {
        let t = Trace::parse(
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds",
            Some(&"x".repeat(TRACESTATE_BYTES_MAX + 1)),
        )
        .unwrap();
        assert_eq!(t.traceparent, GOOD);
        assert_eq!(t.tracestate, None);
        let t = Trace::parse(GOOD, Some("a=1\nb=2")).unwrap();
        assert_eq!(t.tracestate, None);
    }

    #[test]
    fn a_child_keeps_the_trace_and_its_flags_with_a_new_parent() {
        let t = Trace::parse(GOOD, Some("a=1")).unwrap();
        let c = t.child(derived_span_id(&["sid", "7"]));
        assert_eq!(c.trace_id(), t.trace_id());
        assert_ne!(c.parent_id(), t.parent_id());
        assert!(c.sampled());
        assert_eq!(c.tracestate.as_deref(), Some("a=1"));
        assert_eq!(
            Trace::parse(&c.traceparent, None).unwrap().traceparent,
            c.traceparent
        );
    }

    #[test]
    fn derived_span_ids_name_their_parts() {
        assert_eq!(derived_span_id(&["a", "b"]), derived_span_id(&["a", "b"]));
        assert_ne!(derived_span_id(&["a", "b"]), derived_span_id(&["ab"]));
        assert_ne!(derived_span_id(&["a", "b"]), derived_span_id(&["a", "c"]));
    }
}
