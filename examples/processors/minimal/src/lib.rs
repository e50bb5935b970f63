//! The floor of a processor call: the WIT world implemented directly with
//! `wit-bindgen` (no SDK, no serde), built against `streamhost:processor@0.2.0`
//! (the host's copy of that version): the host runs it as it runs 0.3.0's. Its state is the number of events
//! folded, as JSON text; the fold adds the number of events in the batch
//! (counted naively, by their `"offset":` keys: a guest for the benchmark). The processor
//! benchmark instantiates it and calls `fold` with no storage around it:
//! what a wake cannot get below.

wit_bindgen::generate!({
    path: "../../../wasm/wit/0.2.0",
    world: "stream-processor",
    // The world imports wasi:keyvalue (keyed state); unused here, so the
    // component does not import it.
    generate_all,
});

use exports::streamhost::processor::processor::{Announcement, Batch, Failure, Folded, Guest};

struct Minimal;

impl Guest for Minimal {
    fn describe() -> Announcement {
        Announcement {
            slug: "minimal".into(),
            version: "1.0.0".into(),
            consumes: Vec::new(),
        }
    }

    fn initial_state() -> String {
        "0".into()
    }

    fn fold(state: String, batch: Batch) -> Result<Folded, Failure> {
        let before: u64 = state.trim().parse().map_err(|_| Failure {
            message: format!("the state {state:?} is not a count"),
            retryable: false,
        })?;
        // A naive count: the events are a JSON array of objects, each with an
        // `"offset":` key, so counting those keys counts the events.
        let folded = batch.events.matches("\"offset\":").count() as u64;
        Ok(Folded {
            state: (before + folded).to_string(),
            effects: Vec::new(),
        })
    }
}

export!(Minimal);
