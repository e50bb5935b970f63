//! Sends a batch to an exported function of a deployed component (an awaited
//! ITX call). The function takes the batch and returns `result<_, failure>`.

use serde_json::json;

use super::{blocking, Attempt};
use crate::delivery::select::Selection;
use crate::delivery::webhook::posted_event;
use crate::delivery::Failure;
use crate::jsonata::Expression;
use crate::processor::runtime::CallError;

/// The function an ITX job calls, and the transform of its events.
pub struct Call {
    pub project: String,
    pub component: String,
    pub function: String,
    pub transform: Option<Expression>,
}

/// Calls the function with the batch; answers the cursor after what it
/// delivered. A transform that throws on an event after the first
/// delivers the events before it (progress; the next attempt starts at
/// that event, alone, and halts).
pub async fn send(
    Attempt { exec, job, source }: Attempt<'_>,
    selection: Selection,
    call: Call,
) -> Result<u64, Failure> {
    let Call {
        project,
        component,
        function,
        transform,
    } = call;
    let label = job.route.target.label();
    let (storage, runtime) = (exec.storage.clone(), exec.runtime.clone());
    let event_bytes_max = exec.bounds.event_bytes_max;
    let (key, generation, head, timeout_ms) =
        (job.key.clone(), job.generation, job.head, job.timeout_ms);
    let info = source.info.clone();
    // Transforms and the call itself run on a blocking thread.
    let called = blocking(move || {
        let mut offsets: Vec<u64> = Vec::with_capacity(selection.events.len());
        let mut events = Vec::with_capacity(selection.events.len());
        let mut through = selection.through;
        for e in &selection.events {
            let posted = match posted_event(e, transform.as_ref(), &key, event_bytes_max) {
                Ok(posted) => posted,
                Err(_) if !offsets.is_empty() => {
                    through = e.offset - 1;
                    break;
                }
                Err(f) => return Err(f),
            };
            offsets.push(e.offset);
            events.push(json!({
                "offset": e.offset,
                "type": posted["type"],
                "payload": posted["payload"].to_string(),
                "metadata": posted.get("metadata").map(|m| m.to_string()),
                "createdAt": e.created_at,
                "idempotencyKey": e.idempotency_key,
            }));
        }
        let delivery_id = format!(
            "{}:{key}:{generation}:{}-{}",
            info.stream_id,
            offsets[0],
            offsets[offsets.len() - 1]
        );
        let batch = json!({
            "stream": {
                "projectId": info.project_id,
                "path": info.path,
                "streamId": info.stream_id,
                "streamCreatedAt": info.stream_created_at,
                "maxOffset": head,
            },
            "events": events,
            "scannedThroughOffset": through,
            "deliveryId": delivery_id,
            // The run's stamp as fields (the lifetime is in `stream`): a
            // receiver fences a superseded run by comparing them.
            "subscriptionKey": key,
            "cursorChangedAtSourceOffset": generation,
        });
        let prepared = super::deployed_component(&storage, &runtime, &project, &component)?;
        let opts = crate::processor::value::ToVal {
            ignore_unknown_fields: true,
        };
        runtime
            .call_function(&component, &prepared, &function, &[batch], timeout_ms, opts)
            .map(|_| through)
            .map_err(|e| match e {
                CallError::Err(v) => Failure::new(
                    v["message"]
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string()),
                    v["retryable"].as_bool().unwrap_or(true),
                ),
                CallError::Argument(m) => Failure::new(
                    format!("the batch does not fit the function's parameter: {m}"),
                    false,
                ),
                CallError::NoSuchFunction(f) => Failure::new(
                    format!("component {component:?} exports no function {f:?}"),
                    true,
                ),
                CallError::Guest(g) => Failure::new(g.to_string(), g.retryable()),
            })
    })
    .await;
    called.map_err(|mut f| {
        f.message = format!("{label} failed: {}", f.message);
        f
    })
}
