//! Streams: addresses, events, the pure reducer and append planning, what
//! appends and reads answer. The actor that is the one writer of each
//! stream, and the registry of actors, are `crate::actor`.

mod address;
mod append;
mod control;
mod read;
mod state;

internal! {
    quota;
}

pub use crate::event::{
    bounded, is_stream_control_type, types, AppendInput, CopiedFrom, EffectOrigin, Event,
    EventInput, EventSource, OFFSET_MAX, STREAM_TYPE_PREFIX,
};
pub use address::{canonicalize_path, validate_project, Namespace, StreamAddress, PATH_BYTES_MAX};
pub(crate) use append::{configure_offsets, is_same_event, validate_input};
pub use append::{plan_append, AppendContext, AppendPlan, Authority, APPEND_EVENTS_MAX};
pub use control::{validate_control, ControlContext};
pub use read::{AppendOutput, ReadOutput, ReadQuery, EPHEMERAL_BYTES_MAX, READ_LIMIT_MAX};
internal_use!(append::{
    displaced_key, held_by_a_caller,
    PLATFORM_KEY_PREFIXES,
});
pub use state::{CoreState, Inbound, Outbound, Subscriptions, STATE_BYTES_MAX};
