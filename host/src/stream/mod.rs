//! Streams: addresses, events, the pure reducer and append planning, and the
//! actor that is the one writer of each stream.

mod actor;
mod address;
mod append;
mod event;
pub mod quota;
mod registry;
pub(crate) mod remote;
mod runtime;
mod state;

pub use actor::ActorContext;
pub use actor::{AppendOutput, ReadOutput, ReadQuery, EPHEMERAL_BYTES_MAX, READ_LIMIT_MAX};
pub use address::{canonicalize_path, validate_project, Namespace, StreamAddress, PATH_BYTES_MAX};
pub use append::{
    displaced_key, event_bytes_max, held_by_a_caller, plan_append, set_event_bytes_max,
    AppendContext, AppendPlan, Authority, APPEND_EVENTS_MAX, PLATFORM_KEY_PREFIXES,
};
pub(crate) use append::{is_same_event, validate_input};
pub use event::{
    bounded, is_stream_control_type, types, AppendInput, CopiedFrom, EffectOrigin, Event,
    EventInput, EventSource, OFFSET_MAX, STREAM_TYPE_PREFIX,
};
pub use registry::{StreamSettings, Streams, StreamsRef};
pub use runtime::{ConnectionView, DeliveryView, Latency, RuntimeView};
pub use state::{CoreState, Inbound, Outbound, Subscriptions, STATE_BYTES_MAX};
