//! Streams: addresses, the pure reducer and append planning, the
//! validation of control events against a stream's state, what appends and
//! reads answer. The actor that is the one writer of each stream, and the
//! registry of actors, are the host's (`streamhost`'s `actor` module).

mod address;
mod append;
mod control;
pub mod durable;
mod read;
pub mod retention;
mod state;

pub use crate::event::{
    bounded, is_stream_control_type, types, AppendInput, CopiedFrom, EffectOrigin, Event,
    EventInput, EventSource, OFFSET_MAX, STREAM_TYPE_PREFIX,
};
pub use address::{canonicalize_path, validate_project, Namespace, StreamAddress, PATH_BYTES_MAX};
pub use append::APPEND_EVENTS_MAX;
#[doc(hidden)]
pub use append::{displaced_key, held_by_a_caller, PLATFORM_KEY_PREFIXES};
pub use append::{event_at, plan_append, AppendContext, AppendPlan, Authority, RoundKeys};
#[doc(hidden)]
pub use append::{is_same_event, lookup_offsets, validate_input};
pub use control::{validate_control, ControlContext};
pub use read::{
    AppendOutput, ReadOutput, ReadQuery, EPHEMERAL_BYTES_MAX, MAX_BODY_BYTES_DEFAULT,
    READ_LIMIT_MAX,
};
pub use state::{CoreState, Inbound, Outbound, Subscriptions, STATE_BYTES_MAX};
