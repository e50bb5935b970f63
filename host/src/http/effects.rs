//! The processor outbox over HTTP: `GET /v1/projects/{p}/effects` (a page,
//! filtered), `GET .../effects/{id}`, `POST .../effects/{id}:retry` and
//! `POST .../effects/{id}:cancel`.

use serde_json::{json, Value};

use super::error::ApiError;
use super::query::effect_query;
use crate::clock::format_timestamp;
use crate::effect::Status;
use crate::host::Host;
use crate::storage::{EffectOp, EffectRow, Storage, WriteOp};

/// An effect as served.
pub fn effect_json(e: &EffectRow) -> Value {
    let next_attempt_at =
        (e.status == Status::Pending.as_str()).then(|| format_timestamp(e.due_at_ms));
    json!({
        "id": e.id,
        "stream": e.path,
        "streamId": e.stream_id,
        "component": e.component,
        "key": e.key,
        "checkpointOffset": e.checkpoint_offset,
        "target": e.target,
        "status": e.status,
        "attempts": e.attempts,
        "nextAttemptAt": next_attempt_at,
        "lastError": e.last_error,
        "result": e.result,
        "createdAt": e.created_at,
        "settledAt": e.settled_at,
    })
}

async fn read<T: Send + 'static>(
    storage: &Storage,
    what: &'static str,
    f: impl FnOnce(&Storage) -> anyhow::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let storage = storage.clone();
    tokio::task::spawn_blocking(move || f(&storage))
        .await
        .map_err(|e| ApiError::internal(format!("{what} panicked: {e}")))?
        .map_err(|e| ApiError::internal(format!("{what} failed: {e:#}")))
}

/// `GET /v1/projects/{p}/effects`.
pub async fn list(host: &Host, project: &str, query: Option<&str>) -> Result<Value, ApiError> {
    let q = effect_query(project, query)?;
    let limit = q.limit;
    let rows = read(host.streams.storage(), "listing effects", move |s| {
        s.list_effects(&q)
    })
    .await?;
    let next = (rows.len() == limit).then(|| rows[rows.len() - 1].id);
    Ok(json!({
        "effects": rows.iter().map(effect_json).collect::<Vec<_>>(),
        "nextAfterId": next,
    }))
}

fn parse_id(raw: &str) -> Result<i64, ApiError> {
    raw.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError::invalid(format!("effect id {raw:?} is not a positive integer")))
}

async fn load(host: &Host, project: &str, id: i64) -> Result<EffectRow, ApiError> {
    let p = project.to_string();
    read(host.streams.storage(), "reading the effect", move |s| {
        s.effect(&p, id)
    })
    .await?
    .ok_or_else(|| {
        ApiError::not_found(
            "effect-not-found",
            format!("effect {id} does not exist in project {project:?}"),
        )
    })
}

/// `GET /v1/projects/{p}/effects/{id}`.
pub async fn get(host: &Host, project: &str, raw_id: &str) -> Result<Value, ApiError> {
    let id = parse_id(raw_id)?;
    Ok(effect_json(&load(host, project, id).await?))
}

/// `POST .../effects/{id}:retry` and `:cancel`.
pub async fn act(
    host: &Host,
    project: &str,
    raw_id: &str,
    action: &str,
) -> Result<Value, ApiError> {
    let id = parse_id(raw_id)?;
    load(host, project, id).await?;
    let now = chrono::Utc::now().timestamp_millis();
    let (op, code, allowed) = match action {
        "retry" => (
            EffectOp::Retry { id, now_ms: now },
            "effect-not-retryable",
            "only a failed or cancelled effect can be retried",
        ),
        "cancel" => (
            EffectOp::Cancel {
                id,
                settled_at: format_timestamp(now),
            },
            "effect-not-cancellable",
            "only a pending or failed effect can be cancelled",
        ),
        other => {
            return Err(ApiError::not_found(
                "method-not-found",
                format!("unknown effect method {other:?}: use :retry or :cancel"),
            ))
        }
    };
    let changed = host
        .streams
        .storage()
        .submit(WriteOp::Effect(op))
        .await
        .map_err(|_| ApiError::internal("the storage writer stopped"))?
        .map_err(|e| ApiError::internal(format!("updating effect {id} failed: {e}")))?;
    let after = load(host, project, id).await?;
    if changed == 0 {
        return Err(ApiError::conflict(
            code,
            format!("effect {id} is {}: {allowed}", after.status),
        ));
    }
    if action == "retry" {
        host.streams.executors().effects.ring();
    }
    Ok(effect_json(&after))
}
