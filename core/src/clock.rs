//! The injected clock. Pure code takes timestamps as arguments; the edges ask
//! a [`Clock`] for them, so tests can drive time.

use chrono::{DateTime, SecondsFormat, Utc};

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;

    /// Microseconds since the Unix epoch (measurements); by default the
    /// milliseconds, scaled.
    fn now_us(&self) -> i64 {
        self.now_ms().saturating_mul(1000)
    }
}

/// The system's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        Utc::now().timestamp_millis()
    }

    fn now_us(&self) -> i64 {
        Utc::now().timestamp_micros()
    }
}

/// Formats epoch milliseconds as RFC 3339 UTC with milliseconds
/// (`2026-11-30T04:39:01.123Z`), the API's timestamp format.
pub fn format_timestamp(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Reads a time as the API takes one: RFC 3339 (`2026-11-30T04:39:01Z`)
/// or milliseconds since the epoch; the error names the value.
pub fn parse_time(text: &str) -> Result<i64, String> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            format!("{text:?} is not a time: RFC 3339 (2026-11-30T04:39:01Z) or milliseconds since the epoch ({e})")
        })
}

/// Backoff jitter, uniform enough in `[-1, 1]`, from the clock's nanoseconds.
pub fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (nanos % 2001) as f64 / 1000.0 - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_have_milliseconds_and_z() {
        assert_eq!(format_timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_timestamp(1_795_927_141_123),
            "2026-11-29T04:39:01.123Z"
        );
    }
}
