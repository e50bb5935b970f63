//! The floor of a processor call: the WIT world implemented directly with
//! `wit-bindgen` (no SDK, no serde). Its state is the number of events
//! folded, as JSON text; the fold adds the batch's length. The processor
//! benchmark instantiates it and calls `fold` with no storage around it:
//! what a wake cannot get below.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "stream-processor",
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
        Ok(Folded {
            state: (before + batch.events.len() as u64).to_string(),
            effects: Vec::new(),
        })
    }
}

export!(Minimal);
