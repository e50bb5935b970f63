//! A deliberately misbehaving processor for the host's containment tests.
//! It implements the WIT interface directly (not through the SDK's fold) so
//! it can return anything. The event type picks the misbehaviour; other
//! events are counted. `hostile/batch` counts the calls that fold one
//! (`batches`): a state that depends on how the batches were cut, which
//! `streamhost test` must catch. As a reactor, `hostile/loop` spins until
//! the call's timeout.

use streamhost_guest::bindings::exports::streamhost::processor::processor::{
    Announcement, Batch, Failure, Folded, Guest,
};

fn recurse(n: u64) -> u64 {
    let pad = std::hint::black_box([n; 64]);
    if n == u64::MAX {
        return 0;
    }
    recurse(n + 1).wrapping_add(pad[(n % 64) as usize])
}

pub struct Hostile;

impl Guest for Hostile {
    fn describe() -> Announcement {
        Announcement {
            slug: "hostile".into(),
            version: "1.0.0".into(),
            consumes: Vec::new(),
        }
    }

    fn initial_state() -> String {
        "{\"events\":0}".into()
    }

    fn fold(state: String, batch: Batch) -> Result<Folded, Failure> {
        let before = serde_json::from_str::<serde_json::Value>(&state).ok();
        let mut events: u64 = before
            .as_ref()
            .and_then(|v| v["events"].as_u64())
            .unwrap_or(0);
        let mut batches: u64 = before
            .as_ref()
            .and_then(|v| v["batches"].as_u64())
            .unwrap_or(0);
        let mut counted_batch = false;
        // Only the types are read (the host sends the events as one JSON array).
        #[derive(serde::Deserialize)]
        struct Typed {
            #[serde(rename = "type")]
            type_: String,
        }
        let batch_events: Vec<Typed> =
            serde_json::from_str(&batch.events).map_err(|e| Failure {
                message: format!("the batch's events are not JSON: {e}"),
                retryable: false,
            })?;
        for e in &batch_events {
            match e.type_.as_str() {
                "hostile/loop" => loop {
                    std::hint::black_box(&events);
                },
                "hostile/grow" => {
                    let mut hoard: Vec<Vec<u8>> = Vec::new();
                    loop {
                        hoard.push(vec![1u8; 1 << 20]);
                        std::hint::black_box(&hoard);
                    }
                }
                "hostile/stack" => {
                    std::hint::black_box(recurse(0));
                }
                "hostile/trap" => panic!("the hostile guest traps on purpose"),
                // 40 lines of 2,000 bytes on stderr: more than a wake's
                // span keeps.
                "hostile/chatter" => {
                    for i in 0..40 {
                        eprintln!("chatter {i}: {}", "x".repeat(2000));
                    }
                    events += 1;
                }
                // Reads the clock, then traps: a failure that may depend on
                // the call's environment.
                "hostile/clock-trap" => {
                    let now = std::time::SystemTime::now();
                    panic!("the hostile guest traps at {now:?}")
                }
                "hostile/fail" => {
                    return Err(Failure {
                        message: "the hostile guest fails on purpose".into(),
                        retryable: true,
                    })
                }
                "hostile/invalid-json" => {
                    return Ok(Folded {
                        state: "{not json".into(),
                        effects: Vec::new(),
                    })
                }
                "hostile/huge" => {
                    // A valid JSON state of 100 MB, built in place.
                    let size = 100 * 1024 * 1024;
                    let mut state = String::with_capacity(size + 16);
                    state.push_str("{\"blob\":\"");
                    while state.len() < size {
                        state.push_str("xxxxxxxxxxxxxxxx");
                    }
                    state.push_str("\"}");
                    return Ok(Folded {
                        state,
                        effects: Vec::new(),
                    });
                }
                "hostile/batch" => {
                    if !counted_batch {
                        batches += 1;
                        counted_batch = true;
                    }
                }
                _ => events += 1,
            }
        }
        let state = match batches {
            0 => format!("{{\"events\":{events}}}"),
            b => format!("{{\"events\":{events},\"batches\":{b}}}"),
        };
        Ok(Folded {
            state,
            effects: Vec::new(),
        })
    }
}

streamhost_guest::bindings::export_stream_processor!(Hostile with_types_in streamhost_guest::bindings);

/// As a reactor: `hostile/loop` spins until the call's timeout; any other
/// event has no effect.
impl streamhost_guest::Reactor for Hostile {
    fn react(
        event: &streamhost_guest::Event,
        _effects: &mut streamhost_guest::Effects,
    ) -> Result<(), streamhost_guest::Failure> {
        if event.event_type == "hostile/loop" {
            loop {
                std::hint::black_box(event);
            }
        }
        Ok(())
    }
}

streamhost_guest::reactor!(Hostile);
