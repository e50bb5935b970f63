//! What needs an operator, in the projects a caller may use (`GET
//! /healthz?detail=true`):
//! halted subscriptions (processor wakes, ITX calls, webhooks, copies)
//! first, then failing ones, each naming its stream, subscription,
//! processor and last error. Read from storage: a halt is in the stream's
//! cached state, a failing run on its cursor row.

use serde::Serialize;

use crate::auth::Caller;
use crate::error::Error;
use crate::stream::CoreState;

use super::Host;

/// Problems of each kind listed at most.
pub const ATTENTION_LISTED_MAX: usize = 100;

/// Halted and failing subscriptions.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Attention {
    /// Halted: delivery stopped until someone resumes it.
    pub halted: Vec<StuckSubscription>,
    /// Failing: retrying, not yet halted.
    pub failing: Vec<StuckSubscription>,
    /// More than [`ATTENTION_LISTED_MAX`] of a kind: the rest not listed.
    pub truncated: bool,
}

/// One halted or failing subscription.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StuckSubscription {
    /// Its project (none: the global namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// The stream's path.
    pub stream: String,
    /// The subscription's key.
    pub subscription: String,
    /// The processor it wakes, when it wakes one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processor: Option<String>,
    /// Attempts made on the event it is stuck on.
    pub attempts: u64,
    /// The last attempt's error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl Attention {
    /// Nothing halted or failing.
    pub fn is_clear(&self) -> bool {
        self.halted.is_empty() && self.failing.is_empty()
    }
}

impl Host {
    /// What needs an operator, in every project: halted subscriptions
    /// first, then failing ones.
    pub async fn needing_attention(&self) -> Result<Attention, Error> {
        self.needing_attention_of(&Caller::Admin).await
    }

    /// What needs an operator in the projects `caller` may use (an
    /// admin: every project).
    pub(crate) async fn needing_attention_of(&self, caller: &Caller) -> Result<Attention, Error> {
        let projects = match caller.projects() {
            None => vec![None],
            Some(ps) => ps.iter().cloned().map(Some).collect(),
        };
        let storage = self.streams.storage().clone();
        let found = tokio::task::spawn_blocking(move || {
            let mut all = crate::storage::NeedingAttention::default();
            for project in projects {
                let found =
                    storage.needing_attention(project.as_deref(), ATTENTION_LISTED_MAX + 1)?;
                all.halted.extend(found.halted);
                all.failing.extend(found.failing);
            }
            anyhow::Ok(all)
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))?
        .map_err(|e| Error::internal(format!("reading what needs attention failed: {e:#}")))?;
        let mut found = found;
        found.halted.sort();
        found.failing.sort_by(|a, b| {
            (&a.project, &a.path, &a.subscription_key).cmp(&(
                &b.project,
                &b.path,
                &b.subscription_key,
            ))
        });
        let mut out = Attention {
            truncated: found.halted.len() > ATTENTION_LISTED_MAX
                || found.failing.len() > ATTENTION_LISTED_MAX,
            ..Attention::default()
        };
        let project = |p: String| (!p.is_empty()).then_some(p);
        let mut halted_keys = std::collections::HashSet::new();
        for (p, path, state_json) in found.halted.into_iter().take(ATTENTION_LISTED_MAX) {
            // A candidate: the state names which subscriptions are halted.
            let Ok(state) = serde_json::from_str::<CoreState>(&state_json) else {
                continue;
            };
            for (key, sub) in &state.subscriptions.outbound.by_key {
                let Some(halt) = &sub.delivery_halted else {
                    continue;
                };
                halted_keys.insert((p.clone(), path.clone(), key.clone()));
                out.halted.push(StuckSubscription {
                    project: project(p.clone()),
                    stream: path.clone(),
                    subscription: key.clone(),
                    processor: processor_of(sub),
                    attempts: halt.attempts,
                    last_error: halt.error.clone(),
                });
            }
        }
        for run in found.failing.into_iter().take(ATTENTION_LISTED_MAX) {
            let id = (
                run.project.clone(),
                run.path.clone(),
                run.subscription_key.clone(),
            );
            if halted_keys.contains(&id) {
                continue;
            }
            out.failing.push(StuckSubscription {
                project: project(run.project),
                stream: run.path,
                subscription: run.subscription_key,
                processor: None,
                attempts: run.attempts,
                last_error: run.last_error,
            });
        }
        // A failing run's processor is in its stream's state.
        for problem in &mut out.failing {
            let namespace = match &problem.project {
                Some(p) => crate::stream::Namespace::Project(p.clone()),
                None => crate::stream::Namespace::Global,
            };
            let Ok(address) = crate::stream::StreamAddress::new(namespace, &problem.stream) else {
                continue;
            };
            if let Ok(state) = self.streams.state(&address).await {
                problem.processor = state
                    .subscriptions
                    .outbound
                    .by_key
                    .get(&problem.subscription)
                    .and_then(processor_of);
            }
        }
        Ok(out)
    }
}

fn processor_of(sub: &crate::subscription::OutboundSubscription) -> Option<String> {
    match sub.configuration.receiver.needed_export() {
        Some((component, "fold")) => Some(component),
        _ => None,
    }
}
