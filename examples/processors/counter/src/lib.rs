//! The counter processor: counts every event of its stream and sums the
//! numeric `payload.n` fields.

use serde::{Deserialize, Serialize};
use streamhost_guest::{Context, Event, Failure, Processor};

/// Missing fields read as zero, so the counter can take over a state that
/// another version of a processor left.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Count {
    pub events: u64,
    pub sum: i64,
    pub last_offset: u64,
}

pub struct Counter;

impl Counter {
    /// The fold itself, also used natively (the benchmark compares both).
    pub fn apply(state: &mut Count, event: &Event) {
        state.events += 1;
        state.sum += event.payload.get("n").and_then(|n| n.as_i64()).unwrap_or(0);
        state.last_offset = event.offset;
    }
}

impl Processor for Counter {
    type State = Count;
    const SLUG: &'static str = "counter";
    const VERSION: &'static str = "1.0.0";
    const CONSUMES: &'static [&'static str] = &[];
    // Every event of the stream, the platform's included.
    const PLATFORM_EVENTS: bool = true;

    fn fold(state: &mut Count, event: &Event, _ctx: &mut Context) -> Result<(), Failure> {
        Counter::apply(state, event);
        Ok(())
    }
}

streamhost_guest::processor!(Counter);
