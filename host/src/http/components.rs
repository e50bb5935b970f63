//! Components (`PUT`/`GET /v1/projects/{p}/components`) and processor
//! instances (`GET {stream}:processors/{component}`, `POST {stream}:verifyProcessor`).

use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use crate::clock::format_timestamp;
use crate::host::Host;
use crate::processor::keyed::value_json;
use crate::storage::{Deployment, WriteOp};
use crate::stream::{types, validate_project, StreamAddress};
use crate::subscription::Receiver;

/// Largest component accepted, in bytes.
pub const COMPONENT_BYTES_MAX: usize = 64 * 1024 * 1024;

fn invalid_component(m: String) -> ApiError {
    ApiError::new(400, "invalid-component", m)
}

/// Component names follow project names: `[a-z0-9][a-z0-9-]{0,62}`.
fn validate_name(name: &str) -> Result<(), ApiError> {
    validate_project(name).map_err(|_| {
        ApiError::invalid(format!(
            "component name {name:?} is invalid: it must match [a-z0-9][a-z0-9-]{{0,62}}"
        ))
    })
}

/// `PUT /v1/projects/{project}/components/{name}`.
pub async fn deploy(
    host: &Host,
    project: &str,
    name: &str,
    bytes: Vec<u8>,
    refold: bool,
) -> Result<Value, ApiError> {
    validate_name(name)?;
    let runtime = host.streams.wasm_runtime().clone();
    let checked = bytes.clone();
    let exports = tokio::task::spawn_blocking(move || runtime.validate(&checked).map(|(e, _)| e))
        .await
        .map_err(|e| ApiError::internal(format!("validating the component panicked: {e}")))?
        .map_err(invalid_component)?;
    let digest = crate::processor::runtime::digest(&bytes);
    let deployment = Deployment {
        project: project.to_string(),
        name: name.to_string(),
        digest: digest.clone(),
        exports: exports.clone(),
        bytes,
        deployed_at: format_timestamp(chrono::Utc::now().timestamp_millis()),
        refold,
    };
    let new_version = host
        .streams
        .storage()
        .submit(WriteOp::Deploy(deployment))
        .await
        .map_err(|_| ApiError::internal("the storage writer stopped"))?
        .map_err(|e| ApiError::internal(format!("storing the component failed: {e}")))?
        == 1;
    let mut answer = json!({"name": name, "digest": digest, "exports": exports});
    if new_version {
        let versions =
            crate::processor::versions::resume_halted(&host.streams, project, name, &digest);
        let resumed = versions.await?;
        if !resumed.is_empty() {
            answer["resumedSubscriptions"] = json!(resumed);
        }
        let retrying =
            crate::processor::versions::retry_failing(&host.streams, project, name).await;
        if !retrying.is_empty() {
            answer["retryingSubscriptions"] = json!(retrying);
        }
    } else {
        answer["unchanged"] = json!(true);
    }
    if refold {
        let timeout_ms = host.config.delivery.timeout_ms;
        let paths =
            crate::processor::refold::start(&host.streams, project, name, &digest, timeout_ms)
                .await
                .map_err(|e| ApiError::internal(format!("starting the refold failed: {e:#}")))?;
        answer["refolding"] = json!(true);
        answer["refoldingStreams"] = json!(paths);
    }
    Ok(answer)
}

/// `GET /v1/projects/{project}/components`.
pub async fn list(host: &Host, project: &str) -> Result<Value, ApiError> {
    let storage = host.streams.storage().clone();
    let project = project.to_string();
    let rows = tokio::task::spawn_blocking(move || storage.components(&project))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::internal(format!("listing components failed: {e:#}")))?;
    Ok(json!({ "components": rows }))
}

/// A deployed component: its row, and its bytes when `with_bytes`.
pub async fn get(
    host: &Host,
    project: &str,
    name: &str,
    with_bytes: bool,
) -> Result<(crate::storage::ComponentRow, Option<Vec<u8>>), ApiError> {
    let storage = host.streams.storage().clone();
    let (p, n) = (project.to_string(), name.to_string());
    tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let Some(row) = storage.component(&p, &n)? else {
            return Ok(None);
        };
        let bytes = match with_bytes {
            true => Some(storage.component_bytes(&row.digest)?),
            false => None,
        };
        Ok(Some((row, bytes)))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| ApiError::internal(format!("reading the component failed: {e:#}")))?
    .ok_or_else(|| ApiError::component_not_found(project, name))
}

/// The subscription of `stream` that wakes `component`, with its filter.
pub(super) fn wake_subscription(
    state: &crate::stream::CoreState,
    component: &str,
) -> Option<crate::subscription::OutboundSubscription> {
    state
        .subscriptions
        .outbound
        .by_key
        .values()
        .find(|s| match &s.configuration.receiver {
            Receiver::ProcessorWake { expression } => {
                crate::itx::wake_component(expression).ok().as_deref() == Some(component)
            }
            _ => false,
        })
        .cloned()
}

/// `GET {stream}:processors/{component}`.
pub async fn processor(
    host: &Host,
    address: &StreamAddress,
    component: &str,
) -> Result<Value, ApiError> {
    let state = host.streams.state(address).await?;
    let runtime = host.streams.runtime(address).await?;
    let storage = host.streams.storage().clone();
    let ns = address.namespace.storage_key().to_string();
    let path = address.path.clone();
    let name = component.to_string();
    let (checkpoint, last_failure) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let row = storage.load_stream(&ns, &path)?;
        Ok(match &row {
            Some(r) => (
                storage.checkpoint(r.row_id, &name)?,
                storage.processor_failure(r.row_id, &name)?,
            ),
            None => (None, None),
        })
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| ApiError::internal(format!("reading the checkpoint failed: {e:#}")))?;
    let subscription = wake_subscription(&state, component);
    let checkpoint = checkpoint.filter(|c| c.stream_id == state.stream_id);
    if subscription.is_none() && checkpoint.is_none() {
        return Err(ApiError::not_found(
            "processor-not-found",
            format!(
                "processor {component:?} has no instance on stream {:?}",
                address.path
            ),
        ));
    }
    let rt = runtime["subscriptions"]
        .as_object()
        .and_then(|subs| subs.values().find(|r| r["processor"] == component).cloned())
        .unwrap_or(Value::Null);
    let idle_ms = host.config.processors.idle_teardown_ms as i64;
    let now = chrono::Utc::now().timestamp_millis();
    let status = if rt["halted"] == true {
        "halted"
    } else if rt["attempt"].as_u64().unwrap_or(0) > 0 {
        "failing"
    } else if !rt["inFlightDeadlineAt"].is_null()
        || rt["lastDeliveryAt"]
            .as_i64()
            .is_some_and(|t| now - t < idle_ms)
    {
        "active"
    } else {
        "idle"
    };
    Ok(json!({
        "component": component,
        "digest": checkpoint.as_ref().map(|c| c.digest.clone()),
        "streamId": state.stream_id,
        "checkpointOffset": checkpoint.as_ref().map_or(0, |c| c.checkpoint_offset),
        "state": checkpoint.as_ref().and_then(|c| serde_json::from_str::<Value>(&c.state).ok()),
        "status": status,
        "lastError": rt["lastError"],
        "lastFailure": last_failure
            .filter(|f| f.stream_id == state.stream_id)
            .map(|f| json!({
                "failedAt": f.failed_at,
                "offset": f.offset,
                "message": f.message,
                "repro": f.repro,
            })),
        "updatedAt": checkpoint.as_ref().map(|c| c.updated_at.clone()),
    }))
}

/// The bucket of `component`'s instance on `address` (0: no keys yet), or
/// `404 processor-not-found`.
async fn bucket_of(host: &Host, address: &StreamAddress, component: &str) -> Result<i64, ApiError> {
    let state = host.streams.state(address).await?;
    let storage = host.streams.storage().clone();
    let ns = address.namespace.storage_key().to_string();
    let path = address.path.clone();
    let name = component.to_string();
    let checkpoint = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        Ok(match storage.load_stream(&ns, &path)? {
            Some(r) => storage.checkpoint(r.row_id, &name)?,
            None => None,
        })
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| ApiError::internal(format!("reading the checkpoint failed: {e:#}")))?;
    let checkpoint = checkpoint.filter(|c| c.stream_id == state.stream_id);
    match checkpoint {
        Some(c) => Ok(c.bucket),
        None if wake_subscription(&state, component).is_some() => Ok(0),
        None => Err(ApiError::not_found(
            "processor-not-found",
            format!(
                "processor {component:?} has no instance on stream {:?}",
                address.path
            ),
        )),
    }
}

/// `GET {stream}:processors/{component}/keys?prefix=&after=&limit=`: a page
/// of the processor's committed keys and values, in byte order.
pub async fn keys(
    host: &Host,
    address: &StreamAddress,
    component: &str,
    q: super::query::KeysQuery,
) -> Result<Value, ApiError> {
    let bucket = bucket_of(host, address, component).await?;
    let storage = host.streams.storage().clone();
    let limit = q.limit;
    let rows = if bucket == 0 {
        Vec::new()
    } else {
        tokio::task::spawn_blocking(move || {
            storage.keys_page(bucket, &q.prefix, q.after.as_deref(), limit + 1)
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::internal(format!("reading the keys failed: {e:#}")))?
    };
    let more = rows.len() > limit;
    let page: Vec<Value> = rows
        .iter()
        .take(limit)
        .map(|(k, v)| json!({"key": k, "value": value_json(v)}))
        .collect();
    let next = if more {
        rows.get(limit - 1).map(|(k, _)| json!(k))
    } else {
        None
    };
    Ok(json!({"keys": page, "nextAfter": next.unwrap_or(Value::Null)}))
}

/// `GET {stream}:processors/{component}/keys/{key}`: one committed key, or
/// `404 key-not-found`.
pub async fn key(
    host: &Host,
    address: &StreamAddress,
    component: &str,
    key: &str,
) -> Result<Value, ApiError> {
    let bucket = bucket_of(host, address, component).await?;
    let storage = host.streams.storage().clone();
    let k = key.to_string();
    let value = if bucket == 0 {
        None
    } else {
        tokio::task::spawn_blocking(move || storage.key_value(bucket, &k))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| ApiError::internal(format!("reading the key failed: {e:#}")))?
    };
    match value {
        Some(v) => Ok(json!({"key": key, "value": value_json(&v)})),
        None => Err(ApiError::not_found(
            "key-not-found",
            format!(
                "processor {component:?} on stream {:?} has no key {key:?}",
                address.path
            ),
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VerifyInput {
    pub component: String,
}

/// `POST {stream}:verifyProcessor`: refolds the processor from offset 0 in
/// fresh instances with the digest of its checkpoint and compares the state.
pub async fn verify(
    host: &Host,
    address: &StreamAddress,
    input: VerifyInput,
) -> Result<Value, ApiError> {
    let state = host.streams.state(address).await?;
    let storage = host.streams.storage().clone();
    let runtime = host.streams.wasm_runtime().clone();
    let ns = address.namespace.storage_key().to_string();
    let path = address.path.clone();
    let component = input.component.clone();
    let timeout_ms = host.config.delivery.timeout_ms;
    let filter = wake_subscription(&state, &component).and_then(|s| s.configuration.filter);
    let out = tokio::task::spawn_blocking(move || -> Result<Value, ApiError> {
        let internal = |e: anyhow::Error| ApiError::internal(format!("{e:#}"));
        let row = storage
            .load_stream(&ns, &path)
            .map_err(internal)?
            .ok_or_else(|| ApiError::stream_not_found(&path))?;
        let checkpoint = storage
            .checkpoint(row.row_id, &component)
            .map_err(internal)?
            .filter(|c| c.stream_id == state.stream_id)
            .ok_or_else(|| {
                ApiError::not_found(
                    "processor-not-found",
                    format!("processor {component:?} has no checkpoint on stream {path:?}"),
                )
            })?;
        let digest = checkpoint.digest.clone();
        let bytes_storage = storage.clone();
        let prepared = runtime
            .prepare(&checkpoint.digest, move || {
                bytes_storage.component_bytes(&digest)
            })
            .map_err(internal)?;
        let guest = |e: crate::processor::runtime::GuestError| {
            ApiError::new(
                422,
                "processor-failed",
                format!("processor {component:?}: {e}"),
            )
        };
        let announcement = runtime
            .describe(&component, &prepared, timeout_ms)
            .map_err(guest)?;
        let compiled = crate::processor::wake::consumed(
            crate::filter::CompiledFilter::new(filter.as_ref(), false)
                .map_err(ApiError::invalid)?,
            &announcement,
        );
        let initial = runtime
            .initial_state(&component, &prepared, timeout_ms)
            .map_err(guest)?;
        // The wake's own batch fold (`wake::fold_events`): the environment is
        // a function of the events, not of how the wakes cut the batches.
        let fold = crate::processor::backfill::RangeFold {
            guest: crate::processor::wake::Guest {
                runtime: &runtime,
                prepared: &prepared,
                component: &component,
                timeout_ms,
            },
            storage: &storage,
            row_id: row.row_id,
            stream: crate::processor::stream_info(&state, checkpoint.checkpoint_offset),
            filter: compiled,
            narrow: None,
        };
        // Into a scratch bucket: the refold's writes over an empty one.
        let (folded, _, scratch) = fold
            .run(
                initial,
                0,
                checkpoint.checkpoint_offset,
                crate::processor::keyed::Bucket::empty(),
                |_, _| Ok(()),
            )
            .map_err(|f| ApiError::new(422, "processor-failed", f.message))?;
        let stored: Value = serde_json::from_str(&checkpoint.state).unwrap_or(Value::Null);
        let refolded: Value = serde_json::from_str(&folded).unwrap_or(Value::Null);
        let keys = compare_keys(&storage, checkpoint.bucket, scratch.writes()).map_err(internal)?;
        let mut out = json!({
            "component": component,
            "digest": checkpoint.digest,
            "checkpointOffset": checkpoint.checkpoint_offset,
            "matches": stored == refolded && keys.differing.is_none(),
            "storedState": stored,
            "refoldedState": refolded,
            "keysCompared": keys.compared,
        });
        if let Some(d) = keys.differing {
            out["firstDifferingKey"] = json!({
                "key": d.key,
                "stored": d.stored.as_deref().map(value_json),
                "refolded": d.refolded.as_deref().map(value_json),
            });
        }
        Ok(out)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(out)
}

/// A key whose stored and refolded values differ (`None`: absent).
struct Differing {
    key: String,
    stored: Option<Vec<u8>>,
    refolded: Option<Vec<u8>>,
}

/// A key the refold has and storage does not.
fn refolded_only(key: &str, value: &[u8]) -> Differing {
    Differing {
        key: key.to_string(),
        stored: None,
        refolded: Some(value.to_vec()),
    }
}

/// What comparing a stored bucket with a refold's found.
struct Compared {
    compared: u64,
    differing: Option<Differing>,
}

/// Compares every key of the stored `bucket` (0: none) with the refold's
/// (`refolded`, its writes over an empty bucket), in byte order: the number
/// of distinct keys compared, and the first that differs.
fn compare_keys(
    storage: &crate::storage::Storage,
    bucket: i64,
    refolded: &crate::storage::KeyWrites,
) -> anyhow::Result<Compared> {
    let mut theirs = refolded
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
        .peekable();
    let mut compared = 0u64;
    let mut differing: Option<Differing> = None;
    let note = |d: Differing, differing: &mut Option<Differing>| {
        if differing.as_ref().is_none_or(|old| d.key < old.key) {
            *differing = Some(d);
        }
    };
    if bucket != 0 {
        storage.each_key(bucket, |key, value| {
            // Refolded keys before this stored one are missing from storage.
            while let Some((k, v)) = theirs.next_if(|(k, _)| k.as_str() < key.as_str()) {
                compared += 1;
                note(refolded_only(k, v), &mut differing);
            }
            compared += 1;
            match theirs.next_if(|(k, _)| k.as_str() == key.as_str()) {
                Some((_, v)) if *v == value => {}
                other => note(
                    Differing {
                        key,
                        stored: Some(value),
                        refolded: other.map(|(_, v)| v.clone()),
                    },
                    &mut differing,
                ),
            }
            Ok(())
        })?;
    }
    for (k, v) in theirs {
        compared += 1;
        note(refolded_only(k, v), &mut differing);
    }
    Ok(Compared {
        compared,
        differing,
    })
}

/// `GET .../components/{name}/versions`: newest first.
pub async fn versions(host: &Host, project: &str, name: &str) -> Result<Value, ApiError> {
    let storage = host.streams.storage().clone();
    let (p, n) = (project.to_string(), name.to_string());
    let rows = tokio::task::spawn_blocking(move || storage.component_versions(&p, &n))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::internal(format!("reading the versions failed: {e:#}")))?;
    if rows.is_empty() {
        return Err(ApiError::component_not_found(project, name));
    }
    let versions: Vec<Value> = rows
        .into_iter()
        .map(|(digest, deployed_at)| json!({"digest": digest, "deployedAt": deployed_at}))
        .collect();
    Ok(json!({"name": name, "versions": versions}))
}

/// Warnings for subscriptions just configured whose processor or ITX
/// component is not deployed: accepted (it may be deployed later, and then
/// the subscription starts or resumes), but said at once.
pub async fn undeployed_receivers(
    host: &Host,
    address: &StreamAddress,
    events: &[crate::stream::Event],
) -> Vec<String> {
    let Some(project) = address.namespace.project_id().map(str::to_string) else {
        return Vec::new();
    };
    let named: Vec<(String, String)> = events
        .iter()
        .filter(|e| e.event_type == types::SUBSCRIPTION_CONFIGURED && !e.is_copy())
        .filter_map(|e| {
            let config: crate::subscription::SubscriptionConfig =
                serde_json::from_value(Value::Object(e.payload.clone())).ok()?;
            let component = config.receiver.component()?;
            let key = config.subscription_key.unwrap_or_default();
            Some((key, component))
        })
        .collect();
    if named.is_empty() {
        return Vec::new();
    }
    let storage = host.streams.storage().clone();
    tokio::task::spawn_blocking(move || {
        named
            .into_iter()
            .filter(|(_, c)| matches!(storage.component(&project, c), Ok(None)))
            .map(|(key, c)| {
                format!(
                    "subscription {key:?} calls component {c:?}, which is not deployed in project \
                     {project:?}: it fails (and retries, then halts) until it is; deploying it \
                     resumes a halted subscription"
                )
            })
            .collect()
    })
    .await
    .unwrap_or_default()
}
