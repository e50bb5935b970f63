//! What a new version of a component sets off besides a refold: the
//! subscriptions its component halted resume by themselves, once. The
//! deploy records this (`pending_resumes`) in its own transaction and the
//! record goes when the resumes are appended, so a crash in between is made
//! good at the next start ([`resume_pending`]).

use serde::Serialize;
use serde_json::json;

use crate::actor::Streams;
use crate::error::Error;
use crate::storage::WriteOp;
use crate::stream::{types, AppendInput, Authority, EventInput, Namespace, StreamAddress};

/// Resumes the subscriptions of `project` halted by component `name` (a
/// processor wake or an ITX call), once per halt and version (`digest`):
/// the idempotency key makes a repeat a replay. Answers those resumed.
pub async fn resume_halted(
    streams: &Streams,
    project: &str,
    name: &str,
    digest: &str,
) -> Result<Vec<SubscriptionRef>, Error> {
    let storage = streams.storage().clone();
    let (p, quoted) = (project.to_string(), format!("\"{name}\""));
    let candidates =
        tokio::task::spawn_blocking(move || storage.streams_halted_mentioning(&p, &quoted))
            .await
            .map_err(|e| Error::internal(e.to_string()))?
            .map_err(|e| Error::internal(format!("finding halted subscriptions failed: {e:#}")))?;
    let mut resumed = Vec::new();
    for path in candidates {
        let address = StreamAddress::new(Namespace::Project(project.to_string()), &path)?;
        let state = streams.state(&address).await?;
        for (key, idempotency_key) in crate::subscription::resumed_by_new_version(
            &state.subscriptions.outbound.by_key,
            name,
            digest,
        ) {
            let event = EventInput {
                event_type: types::SUBSCRIPTION_DELIVERY_RESUMED.to_string(),
                payload: json!({"subscriptionKey": key}).as_object().cloned(),
                metadata: None,
                idempotency_key: Some(idempotency_key),
                ephemeral: None,
                offset: None,
                source: None,
                trace: None,
                redacted: None,
            };
            let input = AppendInput {
                events: vec![event],
                expected_stream_id: Some(state.stream_id.clone()),
            };
            match streams.append(&address, input, Authority::Platform).await {
                Ok(_) => resumed.push(SubscriptionRef {
                    stream: path.clone(),
                    subscription_key: key,
                }),
                Err(e) => {
                    tracing::warn!(stream = %address, subscription = %key, error = %e.message,
                    "resuming a subscription after a new version failed")
                }
            }
        }
    }
    let done = WriteOp::ResumesDone {
        project: project.to_string(),
        name: name.to_string(),
        digest: digest.to_string(),
    };
    if let Ok(Err(e)) = streams.storage().submit(done).await {
        tracing::warn!(component = name, error = %e, "recording the resumes of a version failed");
    }
    Ok(resumed)
}

/// Retries at once the subscriptions of `project` that are failing (not
/// halted) on component `name` (a processor wake or an ITX call): a new
/// version may be the fix. Answers those retrying; a stream that cannot be
/// asked now is logged and left to its backoff.
pub async fn retry_failing(streams: &Streams, project: &str, name: &str) -> Vec<SubscriptionRef> {
    let storage = streams.storage().clone();
    let p = project.to_string();
    let found = tokio::task::spawn_blocking(move || storage.streams_failing(&p))
        .await
        .map_err(anyhow::Error::from)
        .and_then(|r| r);
    let paths = match found {
        Ok(paths) => paths,
        Err(e) => {
            tracing::warn!(component = name, error = %e, "finding failing subscriptions failed");
            return Vec::new();
        }
    };
    let mut retrying = Vec::new();
    for path in paths {
        let Ok(address) = StreamAddress::new(Namespace::Project(project.to_string()), &path) else {
            continue;
        };
        match streams.retry(&address, None, Some(name)).await {
            Ok(keys) => retrying.extend(keys.into_iter().map(|key| SubscriptionRef {
                stream: path.clone(),
                subscription_key: key,
            })),
            Err(e) => tracing::warn!(stream = %address, component = name, error = %e.message,
                "retrying failing subscriptions after a new version failed"),
        }
    }
    retrying
}

/// At start: the resumes of new versions a previous process did not append.
pub async fn resume_pending(streams: &Streams) {
    let storage = streams.storage().clone();
    let pending = match tokio::task::spawn_blocking(move || storage.pending_resumes()).await {
        Ok(Ok(p)) => p,
        _ => return,
    };
    for (project, name, digest) in pending {
        match resume_halted(streams, &project, &name, &digest).await {
            Ok(resumed) if !resumed.is_empty() => tracing::info!(
                project,
                component = name,
                resumed = resumed.len(),
                "subscriptions resumed for a version deployed before a restart"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(component = name, error = %e.message, "resuming after a new version failed")
            }
        }
    }
}

/// A subscription on a stream of the project: what a deploy resumed or
/// retried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionRef {
    /// The source stream's path.
    pub stream: String,
    /// The subscription's key on it.
    pub subscription_key: String,
}
