//! The subscription endpoints' bodies: `:subscribeToEventsFrom` (a
//! [`crate::host::subscriptions::CopyFrom`]), `:unsubscribeFromEvents`,
//! `:setSubscriptionCursor`, `:resumeSubscription` and
//! `:setSubscriptionCursorAndResume`; the host's methods
//! ([`crate::host::subscriptions`]) carry them out.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnsubscribeInput {
    pub source_stream_path: String,
    pub subscription_key: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CursorInput {
    pub subscription_key: String,
    #[serde(deserialize_with = "crate::stream::bounded::offset")]
    pub after_offset: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeyInput {
    pub subscription_key: String,
}
