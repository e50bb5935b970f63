//! Rolling a new version of a component out over its processor instances,
//! across the host's streams: refolds ([`refold`]), shadows ([`shadow`]:
//! the orchestration; what a shadow folds is `crate::processor::shadow`),
//! and the subscriptions a new version resumes ([`versions`]). These drive
//! the stream registry (`crate::actor`) and the Wasm runtime
//! (`crate::processor`), above both.

pub mod refold;
pub mod shadow;
pub mod versions;
