//! Streams: addresses, events, the pure reducer and append planning, and the
//! actor that is the one writer of each stream.

mod actor;
mod address;
mod append;
mod event;
mod registry;
mod runtime;
mod state;

internal! {
    quota;
    remote;
}

pub use actor::{AppendOutput, ReadOutput, ReadQuery, EPHEMERAL_BYTES_MAX, READ_LIMIT_MAX};
pub use address::{canonicalize_path, validate_project, Namespace, StreamAddress, PATH_BYTES_MAX};
pub(crate) use append::{is_same_event, validate_input};
pub use append::{plan_append, AppendContext, AppendPlan, Authority, APPEND_EVENTS_MAX};
pub use event::{
    bounded, is_stream_control_type, types, AppendInput, CopiedFrom, EffectOrigin, Event,
    EventInput, EventSource, OFFSET_MAX, STREAM_TYPE_PREFIX,
};
pub use runtime::{ConnectionView, DeliveryView, Latency, RuntimeView};
internal_use!(actor::ActorContext);
internal_use!(append::{
    displaced_key, held_by_a_caller,
    PLATFORM_KEY_PREFIXES,
});
internal_use!(registry::{StreamSettings, Streams, StreamsRef});
pub use state::{CoreState, Inbound, Outbound, Subscriptions, STATE_BYTES_MAX};
