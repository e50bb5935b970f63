//! streamhost-guest: write a streamhost processor in Rust.
//!
//! A processor is a serde state type, a fold over the stream's events, and
//! one macro call; the WIT bindings stay hidden. The crate needs
//! `[lib] crate-type = ["cdylib"]` (without it cargo writes no `.wasm`).
//! Build it with `cargo build --release --target wasm32-wasip2` and deploy
//! `target/wasm32-wasip2/release/<crate>.wasm`.
//!
//! ```ignore
//! use streamhost_guest::{Context, Event, Failure, Processor};
//!
//! #[derive(Default, serde::Serialize, serde::Deserialize)]
//! struct Count { events: u64 }
//!
//! struct Counter;
//! impl Processor for Counter {
//!     type State = Count;
//!     const SLUG: &'static str = "counter";
//!     const VERSION: &'static str = "1.0.0";
//!     const CONSUMES: &'static [&'static str] = &[];
//!     fn fold(state: &mut Count, _event: &Event, _ctx: &mut Context) -> Result<(), Failure> {
//!         state.events += 1;
//!         Ok(())
//!     }
//! }
//! streamhost_guest::processor!(Counter);
//! ```
//!
//! A state that outgrows one JSON text (an entry per account, per order)
//! goes into keyed state: [`keyed::Map`], a typed map over the processor's
//! bucket, which a wake reads and writes key by key.

#![warn(missing_docs)]

#[doc(hidden)]
pub mod bindings {
    // The SDK carries its own copy of `wit/processor.wit` (kept identical by
    // a test), so a processor built outside this repository finds it.
    wit_bindgen::generate!({
        path: "wit",
        world: "stream-processor",
        generate_all,
        pub_export_macro: true,
        export_macro_name: "export_stream_processor",
        default_bindings_module: "streamhost_guest::bindings",
    });
}

pub mod keyed;

use bindings::exports::streamhost::processor::processor as wit;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

pub use serde;
pub use serde_json;

/// The stream being folded.
pub use wit::StreamInfo;

/// One committed event, with its payload parsed. Read from the batch as the
/// host sends it (the HTTP API's form; fields not listed here, such as
/// `source`, are skipped).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Its offset in the stream (dense, from 1).
    pub offset: u64,
    /// Its type.
    #[serde(rename = "type")]
    pub event_type: String,
    /// Its payload (an object).
    #[serde(default)]
    pub payload: Value,
    /// Its metadata, if any.
    #[serde(default)]
    pub metadata: Option<Value>,
    /// When it was committed (RFC 3339, milliseconds).
    #[serde(default)]
    pub created_at: String,
    /// Its idempotency key, if any.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

impl Event {
    /// The payload as a typed value.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T, Failure> {
        serde_json::from_value(self.payload.clone()).map_err(|e| {
            Failure::fatal(format!(
                "the payload of the {} event at offset {} does not fit: {e}",
                self.event_type, self.offset
            ))
        })
    }
}

/// A failed fold. Retryable failures are retried with backoff; others halt.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// What went wrong, naming the offending value.
    pub message: String,
    /// Whether trying again may succeed (retried with backoff) or not (the subscription halts).
    pub retryable: bool,
}

impl Failure {
    /// A failure worth retrying (a passing condition).
    pub fn retryable(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            retryable: true,
        }
    }

    /// A failure retrying cannot cure (bad data, a bug): the subscription halts.
    pub fn fatal(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            retryable: false,
        }
    }
}

/// What a fold may use besides the state: the stream, and effects to run
/// after the fold commits.
pub struct Context<'a> {
    /// The stream being folded.
    pub stream: &'a StreamInfo,
    effects: Vec<wit::Effect>,
}

impl Context<'_> {
    /// Append an event to a stream of the same project after the commit.
    pub fn append(
        &mut self,
        key: impl Into<String>,
        stream_path: &str,
        event_type: &str,
        payload: &impl Serialize,
    ) {
        self.effects.push(wit::Effect {
            key: key.into(),
            target: wit::EffectTarget::Append(wit::AppendEffect {
                stream_path: stream_path.to_string(),
                type_: event_type.to_string(),
                payload: serde_json::to_string(payload).unwrap_or_else(|_| "null".into()),
                metadata: None,
            }),
        });
    }

    /// Call an ITX expression (`["components", ["get", NAME], FUNCTION]`)
    /// with JSON arguments after the commit; the result is kept with the
    /// effect.
    pub fn itx(
        &mut self,
        key: impl Into<String>,
        expression: &impl Serialize,
        args: &impl Serialize,
    ) {
        self.effects.push(wit::Effect {
            key: key.into(),
            target: wit::EffectTarget::Itx(wit::ItxEffect {
                expression: serde_json::to_string(expression).unwrap_or_else(|_| "null".into()),
                args: serde_json::to_string(args).unwrap_or_else(|_| "null".into()),
            }),
        });
    }

    /// POST a JSON body to a URL after the commit.
    pub fn webhook(&mut self, key: impl Into<String>, url: &str, body: &impl Serialize) {
        self.effects.push(wit::Effect {
            key: key.into(),
            target: wit::EffectTarget::Webhook(wit::WebhookEffect {
                url: url.to_string(),
                body: serde_json::to_string(body).unwrap_or_else(|_| "null".into()),
            }),
        });
    }
}

/// The prefix of the platform's own event types.
pub const PLATFORM_TYPE_PREFIX: &str = "events.iterate.com/";

/// A processor: a state type and a fold.
pub trait Processor {
    /// The state, stored as JSON between batches.
    type State: Serialize + DeserializeOwned + Default;
    /// A short name for the processor.
    const SLUG: &'static str;
    /// Its version, for humans (the host identifies versions by digest).
    const VERSION: &'static str;
    /// Event types to fold; empty means all (but the platform's, below).
    const CONSUMES: &'static [&'static str];
    /// Whether [`Processor::fold`] sees the platform's own events
    /// (`events.iterate.com/...`: the stream's creation, subscriptions,
    /// connections, halts), which the stream's log holds beside yours. By
    /// default it sees only those [`Processor::CONSUMES`] names.
    const PLATFORM_EVENTS: bool = false;

    /// Folds one event into the state; effects go through `ctx`. Keep it deterministic.
    fn fold(state: &mut Self::State, event: &Event, ctx: &mut Context) -> Result<(), Failure>;

    /// The keyed-state keys folding `event` will read (full keys, prefix
    /// included), if known from the event alone: the SDK reads every key
    /// a batch names in one call to the host before folding it, instead of
    /// one read per key. None by default.
    fn prefetch(_event: &Event) -> Vec<String> {
        Vec::new()
    }
}

#[doc(hidden)]
pub fn __describe<P: Processor>() -> wit::Announcement {
    wit::Announcement {
        slug: P::SLUG.to_string(),
        version: P::VERSION.to_string(),
        consumes: P::CONSUMES.iter().map(|s| s.to_string()).collect(),
    }
}

#[doc(hidden)]
pub fn __initial_state<P: Processor>() -> String {
    serde_json::to_string(&P::State::default()).expect("the default state serializes")
}

fn wit_failure(f: Failure) -> wit::Failure {
    wit::Failure {
        message: f.message,
        retryable: f.retryable,
    }
}

#[doc(hidden)]
pub fn __fold<P: Processor>(state: String, batch: wit::Batch) -> Result<wit::Folded, wit::Failure> {
    let mut s: P::State = serde_json::from_str(&state).map_err(|e| {
        wit_failure(Failure::fatal(format!(
            "the stored state does not fit this processor: {e}"
        )))
    })?;
    // The batch's events arrive as one JSON array, parsed here in one pass.
    let events: Vec<Event> = serde_json::from_str(&batch.events).map_err(|e| {
        wit_failure(Failure::fatal(format!(
            "the batch's events are not the JSON array the host sends: {e}"
        )))
    })?;
    let folded = |e: &&Event| {
        P::PLATFORM_EVENTS
            || !e.event_type.starts_with(PLATFORM_TYPE_PREFIX)
            || P::CONSUMES.contains(&e.event_type.as_str())
    };
    let mut keys: Vec<String> = events.iter().filter(folded).flat_map(P::prefetch).collect();
    keys.sort();
    keys.dedup();
    keyed::prefetch(keys).map_err(wit_failure)?;
    let mut ctx = Context {
        stream: &batch.stream,
        effects: Vec::new(),
    };
    for event in events.iter().filter(folded) {
        P::fold(&mut s, event, &mut ctx).map_err(wit_failure)?;
    }
    let effects = ctx.effects;
    let state = serde_json::to_string(&s)
        .map_err(|e| wit_failure(Failure::fatal(format!("the state does not serialize: {e}"))))?;
    Ok(wit::Folded { state, effects })
}

/// Exports a [`Processor`] as the component's `processor` interface.
#[macro_export]
macro_rules! processor {
    ($processor:ty) => {
        #[doc(hidden)]
        pub struct __StreamhostProcessor;

        impl $crate::bindings::exports::streamhost::processor::processor::Guest for __StreamhostProcessor {
            fn describe() -> $crate::bindings::exports::streamhost::processor::processor::Announcement {
                $crate::__describe::<$processor>()
            }
            fn initial_state() -> ::std::string::String {
                $crate::__initial_state::<$processor>()
            }
            fn fold(
                state: ::std::string::String,
                batch: $crate::bindings::exports::streamhost::processor::processor::Batch,
            ) -> ::core::result::Result<
                $crate::bindings::exports::streamhost::processor::processor::Folded,
                $crate::bindings::exports::streamhost::processor::processor::Failure,
            > {
                $crate::__fold::<$processor>(state, batch)
            }
        }

        // Exported only when built for wasm: natively the processor is a
        // plain Rust library (tests, benchmarks).
        #[cfg(target_arch = "wasm32")]
        $crate::bindings::export_stream_processor!(__StreamhostProcessor with_types_in $crate::bindings);
    };
}
