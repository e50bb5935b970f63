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
//! A reactor runs for each event appended to a stream that configures it,
//! inside the append: its effects commit with the event, or the append
//! fails. It is a [`Reactor`] and a [`reactor!`] call (a crate may export
//! both a processor and a reactor):
//!
//! ```ignore
//! use streamhost_guest::{Effects, Event, Failure, Reactor};
//!
//! struct Welcome;
//! impl Reactor for Welcome {
//!     fn react(event: &Event, effects: &mut Effects) -> Result<(), Failure> {
//!         let user = event.payload["userId"].as_str().ok_or_else(|| Failure::fatal("no userId"))?;
//!         effects.webhook(format!("welcome:{user}"), "https://mail.example/welcome", &event.payload);
//!         Ok(())
//!     }
//! }
//! streamhost_guest::reactor!(Welcome);
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

#[doc(hidden)]
pub mod reactor_bindings {
    // The reactor's world (it imports nothing); a component that exports
    // both calls both export macros, and the componentizer merges them.
    wit_bindgen::generate!({
        path: "wit",
        world: "stream-reactor",
        pub_export_macro: true,
        export_macro_name: "export_stream_reactor",
        default_bindings_module: "streamhost_guest::reactor_bindings",
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
    /// Where the platform says it came from, if anywhere: `copiedFrom` (a
    /// subscription copied it) or `effect` (an effect appended it, a timer
    /// among them: `{"path", "streamId", "component", "key",
    /// "checkpointOffset"}`).
    #[serde(default)]
    pub source: Option<Value>,
    /// Set when its payload and metadata were erased (`:redact`):
    /// `{"at", "reason"}`. Its payload is then `null`: a fold decides what
    /// a redacted event means to it (a refold meets it as redacted).
    #[serde(default)]
    pub redacted: Option<Value>,
}

impl Event {
    /// When it was committed, in milliseconds since the epoch (0 if
    /// `created_at` is not an RFC 3339 UTC time).
    pub fn created_ms(&self) -> u64 {
        time::parse_ms(&self.created_at).unwrap_or(0)
    }

    /// The key of the effect that appended it (a timer's, say), if an
    /// effect did.
    pub fn effect_key(&self) -> Option<&str> {
        self.source.as_ref()?.get("effect")?.get("key")?.as_str()
    }

    /// Whether its payload and metadata were erased (`:redact`).
    pub fn is_redacted(&self) -> bool {
        self.redacted.is_some()
    }

    /// The payload as a typed value (a redacted event's fails, saying so).
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T, Failure> {
        if let Some(r) = &self.redacted {
            return Err(Failure::fatal(format!(
                "the {} event at offset {} was redacted ({}): its payload is gone; check \
                 `is_redacted()` before reading it",
                self.event_type,
                self.offset,
                r.get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given")
            )));
        }
        serde_json::from_value(self.payload.clone()).map_err(|e| {
            Failure::fatal(format!(
                "the payload of the {} event at offset {} does not fit: {e}",
                self.event_type, self.offset
            ))
        })
    }
}

#[cfg(test)]
mod event_tests {
    use super::Event;

    #[test]
    fn a_redacted_event_reads_as_redacted_and_its_typed_payload_says_so() {
        let plain: Event = serde_json::from_str(
            r#"{"offset": 3, "type": "x.y/paid", "payload": {"n": 5}, "createdAt": "t"}"#,
        )
        .unwrap();
        assert!(!plain.is_redacted());
        assert_eq!(plain.payload_as::<serde_json::Value>().unwrap()["n"], 5);
        let redacted: Event = serde_json::from_str(
            r#"{"offset": 3, "type": "x.y/paid", "payload": null, "metadata": null,
                "createdAt": "t", "redacted": {"at": "t2", "reason": "erasure request"}}"#,
        )
        .unwrap();
        assert!(redacted.is_redacted());
        assert!(redacted.payload.is_null() && redacted.metadata.is_none());
        let e = redacted.payload_as::<serde_json::Value>().unwrap_err();
        assert!(
            e.message
                .contains("offset 3 was redacted (erasure request)"),
            "{}",
            e.message
        );
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

mod time {
    /// Milliseconds since the epoch of `2026-11-30T04:39:01.123Z` (the
    /// host's form: UTC, optional fraction).
    pub fn parse_ms(text: &str) -> Option<u64> {
        let b = text.as_bytes();
        if b.len() < 20
            || b[4] != b'-'
            || b[7] != b'-'
            || b[10] != b'T'
            || b[13] != b':'
            || b[16] != b':'
        {
            return None;
        }
        let num = |from: usize, to: usize| -> Option<i64> { text.get(from..to)?.parse().ok() };
        let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
        let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
        let rest = &text[19..];
        let (fraction, zone) = match rest.strip_prefix('.') {
            Some(f) => {
                let digits = f.bytes().take_while(u8::is_ascii_digit).count();
                (&f[..digits], &f[digits..])
            }
            None => ("", rest),
        };
        if !(zone == "Z" || zone == "+00:00")
            || !(1..=12).contains(&month)
            || !(1..=31).contains(&day)
        {
            return None;
        }
        let mut millis = 0i64;
        for (i, c) in fraction.bytes().take(3).enumerate() {
            millis += i64::from(c - b'0') * [100, 10, 1][i];
        }
        // Days from the civil date (Howard Hinnant's algorithm).
        let y = if month <= 2 { year - 1 } else { year };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (month + 9) % 12;
        let doy = (153 * mp + 2) / 5 + day - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        let ms = ((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis;
        u64::try_from(ms).ok()
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn the_hosts_times_read_as_milliseconds() {
            assert_eq!(parse_ms("1970-01-01T00:00:00Z"), Some(0));
            assert_eq!(
                parse_ms("2026-12-05T00:00:01.250Z"),
                Some(1_796_428_801_250)
            );
            assert_eq!(
                parse_ms("2024-02-29T23:59:59.999+00:00"),
                Some(1_709_251_199_999)
            );
            assert_eq!(parse_ms("2026-12-05 00:00:01Z"), None);
            assert_eq!(parse_ms("yesterday"), None);
        }
        use super::parse_ms;
    }
}

/// What a fold may use besides the state: the stream, and effects to run
/// after the fold commits (the [`Effects`] methods, through `ctx`).
pub struct Context<'a> {
    /// The stream being folded.
    pub stream: &'a StreamInfo,
    effects: Effects<'a>,
}

impl<'a> std::ops::Deref for Context<'a> {
    type Target = Effects<'a>;
    fn deref(&self) -> &Effects<'a> {
        &self.effects
    }
}

impl<'a> std::ops::DerefMut for Context<'a> {
    fn deref_mut(&mut self) -> &mut Effects<'a> {
        &mut self.effects
    }
}

/// One effect as asked for, before it takes a world's WIT type.
enum Asked {
    Append {
        stream_path: String,
        event_type: String,
        payload: String,
    },
    Webhook {
        url: String,
        body: String,
    },
    Itx {
        expression: String,
        args: String,
    },
    Cancel {
        key: String,
    },
}

/// One effect asked for: its key, what it does, and its envelope.
struct AskedEffect {
    key: String,
    asked: Asked,
    not_before: Option<u64>,
    effect_type: Option<String>,
    metadata: Option<String>,
    group: Option<String>,
}

/// Effects to run after the commit (a fold's, or a reactor's), each with a
/// key that makes it idempotent.
#[derive(Default)]
pub struct Effects<'a> {
    asked: Vec<AskedEffect>,
    /// The `createdAt` of the event being folded: what
    /// [`EffectEnvelope::after`] counts from (read only when asked).
    created_at: &'a str,
}

/// The effect just asked for: give it a time and an envelope.
pub struct EffectEnvelope<'a> {
    effect: &'a mut AskedEffect,
    created_at: &'a str,
}

impl EffectEnvelope<'_> {
    /// Not before `delay` after the event being folded (its `createdAt`:
    /// refolds and shadows compute the same time). A delayed `append` to
    /// the processor's own stream is a timer.
    pub fn after(self, delay: std::time::Duration) -> Self {
        let delay = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let now_ms = time::parse_ms(self.created_at).unwrap_or(0);
        self.effect.not_before = Some(now_ms.saturating_add(delay));
        self
    }

    /// Not before `ms` (milliseconds since the epoch; in the past: at once).
    pub fn at(self, ms: u64) -> Self {
        self.effect.not_before = Some(ms);
        self
    }

    /// Its type (`SendWelcome`).
    pub fn typed(self, effect_type: impl Into<String>) -> Self {
        self.effect.effect_type = Some(effect_type.into());
        self
    }

    /// Its metadata, a JSON object (`{"correlationId": ...}`).
    pub fn metadata(self, metadata: &impl Serialize) -> Self {
        self.effect.metadata = Some(json_text(metadata));
        self
    }

    /// Its ordering group (kept and served with the effect).
    pub fn group(self, group: impl Into<String>) -> Self {
        self.effect.group = Some(group.into());
        self
    }
}

fn json_text(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".into())
}

impl<'e> Effects<'e> {
    fn ask(&mut self, key: String, asked: Asked) -> EffectEnvelope<'_> {
        self.asked.push(AskedEffect {
            key,
            asked,
            not_before: None,
            effect_type: None,
            metadata: None,
            group: None,
        });
        EffectEnvelope {
            effect: self.asked.last_mut().expect("just pushed"),
            created_at: self.created_at,
        }
    }

    /// Cancel this processor's (or reactor's) effect `key` on this stream if
    /// it is still pending (a timer not yet due, say); of a running, settled
    /// or unknown one it does nothing. It applies in the commit that stores
    /// it, after the commit's other effects. Its own key is `cancel:<key>`.
    pub fn cancel(&mut self, key: impl Into<String>) -> EffectEnvelope<'_> {
        let key = key.into();
        self.ask(format!("cancel:{key}"), Asked::Cancel { key })
    }

    /// The time of the event being folded or reacted to (ms since the
    /// epoch, its `createdAt`): the fold's clock.
    pub fn now_ms(&self) -> u64 {
        time::parse_ms(self.created_at).unwrap_or(0)
    }

    /// Append an event to a stream of the same project after the commit.
    pub fn append(
        &mut self,
        key: impl Into<String>,
        stream_path: &str,
        event_type: &str,
        payload: &impl Serialize,
    ) -> EffectEnvelope<'_> {
        self.ask(
            key.into(),
            Asked::Append {
                stream_path: stream_path.to_string(),
                event_type: event_type.to_string(),
                payload: json_text(payload),
            },
        )
    }

    /// Call an ITX expression (`["components", ["get", NAME], FUNCTION]`)
    /// with JSON arguments after the commit; the result is kept with the
    /// effect.
    pub fn itx(
        &mut self,
        key: impl Into<String>,
        expression: &impl Serialize,
        args: &impl Serialize,
    ) -> EffectEnvelope<'_> {
        self.ask(
            key.into(),
            Asked::Itx {
                expression: json_text(expression),
                args: json_text(args),
            },
        )
    }

    /// POST a JSON body to a URL after the commit.
    pub fn webhook(
        &mut self,
        key: impl Into<String>,
        url: &str,
        body: &impl Serialize,
    ) -> EffectEnvelope<'_> {
        self.ask(
            key.into(),
            Asked::Webhook {
                url: url.to_string(),
                body: json_text(body),
            },
        )
    }

    /// How many effects were asked for so far.
    pub fn len(&self) -> usize {
        self.asked.len()
    }

    /// Whether none were.
    pub fn is_empty(&self) -> bool {
        self.asked.is_empty()
    }
}

/// The same conversion for each world's copy of the effect types.
macro_rules! into_wit_target {
    ($name:ident, $($m:ident)::+) => {
        fn $name(asked: Asked) -> $($m)::+::EffectTarget {
            use $($m)::+ as w;
            match asked {
                Asked::Append {
                    stream_path,
                    event_type,
                    payload,
                } => w::EffectTarget::Append(w::AppendEffect {
                    stream_path,
                    type_: event_type,
                    payload,
                    metadata: None,
                }),
                Asked::Webhook { url, body } => {
                    w::EffectTarget::Webhook(w::WebhookEffect { url, body })
                }
                Asked::Itx { expression, args } => {
                    w::EffectTarget::Itx(w::ItxEffect { expression, args })
                }
                Asked::Cancel { key } => w::EffectTarget::Cancel(key),
            }
        }
    };
}
into_wit_target!(
    fold_target,
    bindings::exports::streamhost::processor::processor
);
into_wit_target!(
    react_target,
    reactor_bindings::exports::streamhost::processor::reactor
);

fn fold_effects(effects: Effects<'_>) -> Vec<wit::Effect> {
    effects
        .asked
        .into_iter()
        .map(|e| wit::Effect {
            key: e.key,
            target: fold_target(e.asked),
            not_before: e.not_before,
            type_: e.effect_type,
            metadata: e.metadata,
            group: e.group,
        })
        .collect()
}

fn react_effects(
    effects: Effects<'_>,
) -> Vec<reactor_bindings::exports::streamhost::processor::reactor::Effect> {
    effects
        .asked
        .into_iter()
        .map(
            |e| reactor_bindings::exports::streamhost::processor::reactor::Effect {
                key: e.key,
                target: react_target(e.asked),
                not_before: e.not_before,
                type_: e.effect_type,
                metadata: e.metadata,
                group: e.group,
            },
        )
        .collect()
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
        effects: Effects::default(),
    };
    for event in events.iter().filter(folded) {
        ctx.effects.created_at = &event.created_at;
        P::fold(&mut s, event, &mut ctx).map_err(wit_failure)?;
    }
    let effects = fold_effects(ctx.effects);
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

/// A reactor: the effects of one appended event, committed with it. Keep it
/// deterministic (the clock reads the event's `createdAt`).
pub trait Reactor {
    /// The effects of `event` go into `effects`; an error fails the append
    /// that carries the event (`422 reactor-failed`, nothing commits).
    fn react(event: &Event, effects: &mut Effects) -> Result<(), Failure>;
}

#[doc(hidden)]
pub fn __react<R: Reactor>(
    event: String,
) -> Result<
    Vec<reactor_bindings::exports::streamhost::processor::reactor::Effect>,
    reactor_bindings::exports::streamhost::processor::reactor::Failure,
> {
    use reactor_bindings::exports::streamhost::processor::reactor as w;
    let failure = |f: Failure| w::Failure {
        message: f.message,
        retryable: f.retryable,
    };
    let event: Event = serde_json::from_str(&event).map_err(|e| {
        failure(Failure::fatal(format!(
            "the event is not the JSON object the host sends: {e}"
        )))
    })?;
    let mut effects = Effects {
        created_at: &event.created_at,
        ..Effects::default()
    };
    R::react(&event, &mut effects).map_err(failure)?;
    Ok(react_effects(effects))
}

/// Exports a [`Reactor`] as the component's `reactor` interface.
#[macro_export]
macro_rules! reactor {
    ($reactor:ty) => {
        #[doc(hidden)]
        pub struct __StreamhostReactor;

        impl $crate::reactor_bindings::exports::streamhost::processor::reactor::Guest for __StreamhostReactor {
            fn react(
                event: ::std::string::String,
            ) -> ::core::result::Result<
                ::std::vec::Vec<$crate::reactor_bindings::exports::streamhost::processor::reactor::Effect>,
                $crate::reactor_bindings::exports::streamhost::processor::reactor::Failure,
            > {
                $crate::__react::<$reactor>(event)
            }
        }

        #[cfg(target_arch = "wasm32")]
        $crate::reactor_bindings::export_stream_reactor!(__StreamhostReactor with_types_in $crate::reactor_bindings);
    };
}
