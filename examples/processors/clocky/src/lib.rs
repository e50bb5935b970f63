//! Clocky: a processor whose fold reads the WASI wall clock and random
//! bytes, as a processor author may (to stamp a state, pick a sample), and
//! keeps a global counter. It shows that a fold's environment is a function
//! of the events alone: verify, refolds and `streamhost fold` reproduce its
//! state whatever batches the wakes folded; and `maxCounter` stays 1, since
//! every call runs in a fresh instance.
//!
//! It is a reactor too: each event yields one append effect (key
//! `seen-<offset>`) to `/clocky/seen` whose payload is what the call saw:
//! `{"offset", "clockMs", "rand", "counter"}`, so a test can hold a
//! reactor's environment to the event (the clock reads its `createdAt`,
//! the random bytes are the same for the same event, the counter is 1).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use streamhost_guest::{Context, Effects, Event, Failure, Processor, Reactor};

#[allow(clippy::all)]
mod random {
    // WASI's `wasi:random/random` interface, as std's own bindings declare it.
    wit_bindgen::generate!({
        inline: "
            package wasi:random@0.2.0;
            interface random {
                get-random-bytes: func(len: u64) -> list<u8>;
                get-random-u64: func() -> u64;
            }
            world clocky-imports {
                import random;
            }
        ",
    });
}

/// Events folded by this instance (a fresh instance per call starts at 0).
static COUNTER: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Seen {
    pub count: u64,
    /// Sum of the wall clock's milliseconds at each fold.
    pub clock: u64,
    /// Sum of one random number (32 bits) per fold.
    pub rand: u64,
    /// The highest value of the global counter.
    pub max_counter: u64,
}

pub struct Clocky;

impl Processor for Clocky {
    type State = Seen;
    const SLUG: &'static str = "clocky";
    const VERSION: &'static str = "1.0.0";
    const CONSUMES: &'static [&'static str] = &[];
    // Every event of the stream, the platform's included.
    const PLATFORM_EVENTS: bool = true;

    fn fold(state: &mut Seen, _event: &Event, _ctx: &mut Context) -> Result<(), Failure> {
        let counter = COUNTER.fetch_add(1, Ordering::Relaxed) + 1;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        state.count += 1;
        state.clock = state.clock.wrapping_add(now);
        state.rand = state
            .rand
            .wrapping_add(random::wasi::random::random::get_random_u64() >> 32);
        state.max_counter = state.max_counter.max(counter);
        Ok(())
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Reactor for Clocky {
    fn react(event: &Event, effects: &mut Effects) -> Result<(), Failure> {
        let counter = COUNTER.fetch_add(1, Ordering::Relaxed) + 1;
        effects.append(
            format!("seen-{}", event.offset),
            "/clocky/seen",
            "clocky.example/seen",
            &serde_json::json!({
                "offset": event.offset,
                "clockMs": now_ms(),
                "rand": random::wasi::random::random::get_random_u64() >> 32,
                "counter": counter,
            }),
        );
        Ok(())
    }
}

streamhost_guest::processor!(Clocky);
streamhost_guest::reactor!(Clocky);
