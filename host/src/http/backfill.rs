//! `POST {stream}:backfillProcessor`: fold one named processor from its
//! initial state over a range of the stream's committed events and keep
//! only the effects (its state and checkpoint do not change). Effects are
//! deduplicated by identity, so running it twice creates nothing the second
//! time. With `accept: application/x-ndjson` the answer streams a
//! `{"progress": ...}` line after the first batch and then at most every half second and ends with
//! `{"result": ...}` (or `{"error": ...}`).

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::error::ApiError;
use crate::clock::format_timestamp;
use crate::delivery::Failure;
use crate::filter::CompiledFilter;
use crate::host::Host;
use crate::processor::backfill::{Progress, RangeFold};
use crate::processor::keyed::Bucket;
use crate::processor::wake::{consumed, Guest};
use crate::storage::{EffectOp, EffectSource, WriteOp};
use crate::stream::StreamAddress;
use crate::subscription::Filter;

/// Least time between two progress lines.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackfillInput {
    pub component: String,
    #[serde(default, deserialize_with = "crate::stream::bounded::offset")]
    pub after_offset: u64,
    #[serde(default, deserialize_with = "crate::stream::bounded::optional_offset")]
    pub through_offset: Option<u64>,
    #[serde(default)]
    pub event_types: Option<Vec<String>>,
    #[serde(default)]
    pub jsonata_condition: Option<String>,
}

/// What a backfill came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backfilled {
    pub progress: Progress,
    pub created: u64,
    pub existing: u64,
}

impl Backfilled {
    fn to_json(&self) -> Value {
        json!({
            "scanned": self.progress.scanned,
            "folded": self.progress.folded,
            "effectsCreated": self.created,
            "effectsExisting": self.existing,
        })
    }
}

/// Runs a backfill; `progress` hears of each batch.
pub async fn backfill(
    host: &Host,
    address: &StreamAddress,
    input: BackfillInput,
    progress: Option<mpsc::UnboundedSender<Value>>,
) -> Result<Value, ApiError> {
    let state = host.streams.state(address).await?;
    let subscription =
        super::components::wake_subscription(&state, &input.component).ok_or_else(|| {
            ApiError::not_found(
                "processor-not-found",
                format!(
                    "processor {:?} has no processor-wake subscription on stream {:?}",
                    input.component, address.path
                ),
            )
        })?;
    let head = state.max_offset;
    let through = input.through_offset.unwrap_or(head).min(head);
    if input.after_offset > through {
        return Err(ApiError::invalid(format!(
            "afterOffset {} is past throughOffset {through}",
            input.after_offset
        )));
    }
    let narrow =
        if input.event_types.is_some() || input.jsonata_condition.is_some() {
            let filter = Filter {
                event_types: input.event_types.clone(),
                jsonata_condition: input.jsonata_condition.clone(),
            };
            Some(CompiledFilter::new(Some(&filter), false).map_err(|m| {
                ApiError::new(400, "invalid-jsonata", format!("jsonataCondition: {m}"))
            })?)
        } else {
            None
        };
    let subscription_filter = CompiledFilter::for_subscription(&subscription)
        .map_err(|m| ApiError::new(400, "invalid-jsonata", m))?;
    let storage = host.streams.storage().clone();
    let runtime = host.streams.wasm_runtime().clone();
    let project = address.namespace.storage_key().to_string();
    let path = address.path.clone();
    let component = input.component.clone();
    let timeout_ms = host.config.delivery.timeout_ms;
    let stream = crate::processor::stream_info(&state, through);
    let after = input.after_offset;
    let done = tokio::task::spawn_blocking(move || -> Result<Backfilled, ApiError> {
        let failed = |f: Failure| ApiError::new(422, "processor-failed", f.message);
        let internal = |e: anyhow::Error| ApiError::internal(format!("{e:#}"));
        let row = storage
            .load_stream(&project, &path)
            .map_err(internal)?
            .ok_or_else(|| ApiError::stream_not_found(&path))?;
        let (prepared, _) = crate::processor::deployed(&storage, &runtime, &project, &component)
            .map_err(internal)?
            .ok_or_else(|| ApiError::component_not_found(&project, &component))?;
        let guest = Guest {
            runtime: &runtime,
            prepared: &prepared,
            component: &component,
            timeout_ms,
        };
        let announcement = runtime
            .describe(&component, &prepared, timeout_ms)
            .map_err(|e| ApiError::new(422, "processor-failed", format!("{component}: {e}")))?;
        let initial = runtime
            .initial_state(&component, &prepared, timeout_ms)
            .map_err(|e| ApiError::new(422, "processor-failed", format!("{component}: {e}")))?;
        let source = EffectSource {
            project: project.clone(),
            path: path.clone(),
            stream_id: stream.stream_id.clone(),
            component: component.clone(),
        };
        let fold = RangeFold {
            guest,
            storage: &storage,
            row_id: row.row_id,
            stream,
            filter: consumed(subscription_filter, &announcement),
            narrow,
        };
        let mut counts = Backfilled::default();
        // The first batch reports at once, later ones at most every PROGRESS_EVERY.
        let mut last_report: Option<Instant> = None;
        let (_, final_progress, _) = fold
            .run(initial, after, through, Bucket::empty(), |effects, at| {
                if !effects.is_empty() {
                    let now = chrono::Utc::now().timestamp_millis();
                    let returned = effects.len() as u64;
                    let created = storage
                        .submit(WriteOp::Effect(EffectOp::Insert {
                            source: source.clone(),
                            effects,
                            now_ms: now,
                            created_at: format_timestamp(now),
                        }))
                        .blocking_recv()
                        .map_err(|_| Failure::new("the storage writer stopped", true))?
                        .map_err(|e| Failure::new(format!("storing effects failed: {e}"), true))?
                        as u64;
                    counts.created += created;
                    counts.existing += returned - created;
                }
                if let Some(tx) = &progress {
                    if last_report.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                        last_report = Some(Instant::now());
                        let _ = tx.send(json!({"progress": {
                            "throughOffset": at.through, "headOffset": through,
                            "scanned": at.scanned, "folded": at.folded,
                            "effectsCreated": counts.created}}));
                    }
                }
                Ok(())
            })
            .map_err(failed)?;
        counts.progress = final_progress;
        Ok(counts)
    })
    .await
    .map_err(|e| ApiError::internal(format!("the backfill panicked: {e}")))??;
    if done.created > 0 {
        host.streams.executors().effects.ring();
    }
    Ok(done.to_json())
}

/// The backfill as a stream of JSON lines: progress, then the result.
pub fn streamed(host: Host, address: StreamAddress, input: BackfillInput) -> Response {
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    let progress = tx.clone();
    tokio::spawn(async move {
        let line = match backfill(&host, &address, input, Some(progress)).await {
            Ok(result) => json!({ "result": result }),
            Err(e) => json!({"error": {"code": e.code, "message": e.message}}),
        };
        let _ = tx.send(line);
    });
    let lines = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|v| (Ok::<_, std::convert::Infallible>(format!("{v}\n")), rx))
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}
