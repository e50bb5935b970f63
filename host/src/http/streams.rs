//! `GET /v1/projects/{project}/streams` (and `/v1/global/streams`): the
//! streams of a namespace in path order, read from their stored rows (no
//! actor is started).

use serde_json::{json, Value};

use super::error::ApiError;
use super::query::ListQuery;
use crate::host::Host;
use crate::stream::{CoreState, Namespace};

/// One page of the stream list.
pub async fn list(host: &Host, namespace: &Namespace, q: ListQuery) -> Result<Value, ApiError> {
    let storage = host.streams.storage().clone();
    let key = namespace.storage_key().to_string();
    let limit = q.limit;
    let rows = tokio::task::spawn_blocking(move || {
        storage.list_streams(&key, &q.prefix, q.after_path.as_deref(), q.limit)
    })
    .await
    .map_err(|e| ApiError::internal(format!("listing streams failed: {e}")))?
    .map_err(|e| ApiError::internal(format!("listing streams failed: {e:#}")))?;
    let next = (rows.len() == limit).then(|| rows[rows.len() - 1].path.clone());
    let streams: Vec<Value> = rows
        .into_iter()
        .map(|r| {
            let state: Option<CoreState> = serde_json::from_str(&r.state_json).ok();
            json!({
                "path": r.path,
                "streamId": r.stream_id,
                "createdAt": r.created_at,
                "maxOffset": state.as_ref().map_or(r.head_offset, |s| s.max_offset.max(r.head_offset)),
                "eventCount": state.as_ref().map(|s| s.event_count),
                "paused": state.as_ref().is_some_and(|s| s.paused),
                "subscriptions": state.as_ref().map_or(0, |s| s.subscriptions.outbound.by_key.len()),
            })
        })
        .collect();
    Ok(json!({"streams": streams, "nextAfterPath": next}))
}
