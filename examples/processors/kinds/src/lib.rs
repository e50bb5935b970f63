//! An ITX-callable component (not a processor): functions over every WIT
//! type kind, and an `itx-call` receiver. Built with wit-bindgen directly.

wit_bindgen::generate!({
    path: "wit",
    world: "kinds-world",
});

use exports::example::kinds::kinds::{Batch, Everything, Failure, Guest};

struct Kinds;

impl Guest for Kinds {
    fn echo_everything(e: Everything) -> Everything {
        e
    }

    fn add(a: u32, b: u32) -> u32 {
        a.wrapping_add(b)
    }

    fn divide(a: f64, b: f64) -> Result<f64, String> {
        if b == 0.0 {
            Err(format!("cannot divide {a} by zero"))
        } else {
            Ok(a / b)
        }
    }

    fn boom() -> u32 {
        panic!("boom")
    }

    fn spin() -> u32 {
        let mut n: u32 = 0;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    }

    fn process_event_batch(batch: Batch) -> Result<(), Failure> {
        let offsets: Vec<String> = batch.events.iter().map(|e| e.offset.to_string()).collect();
        // The host logs guest stdout; the tests read it to see each batch.
        println!(
            "itx batch delivery-id={} offsets={} scanned-through={} subscription-key={} run={}",
            batch.delivery_id,
            offsets.join(","),
            batch.scanned_through_offset,
            batch.subscription_key,
            batch.cursor_changed_at_source_offset
        );
        for e in &batch.events {
            if e.payload.contains("\"fatal\":true") {
                return Err(Failure {
                    message: format!("event {} is fatal", e.offset),
                    retryable: false,
                });
            }
            if e.payload.contains("\"bad\":true") {
                return Err(Failure {
                    message: format!("event {} is bad", e.offset),
                    retryable: true,
                });
            }
        }
        Ok(())
    }
}

export!(Kinds);
