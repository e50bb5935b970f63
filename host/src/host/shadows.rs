//! Shadow versions on the `Host` (`crate::processor::shadow`): a shadow's
//! view against the live instance (`:processors/{component}/shadow`), its
//! promotion (`:promoteShadow`) and its discard (`:discardShadow`).

use serde::{Deserialize, Serialize};

use super::request::{StreamAnswer, StreamRequest};
use super::Host;
use crate::error::Error;
use crate::processor::shadow::{self as fold, Promotion};
pub use crate::processor::shadow::{HeldEffects, KeyChange, KeysDiff, ShadowView, SAMPLE_MAX};
use crate::rollout::shadow;
use crate::stream::StreamAddress;

/// The body of `:promoteShadow`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Promote {
    /// The component whose shadow takes over.
    pub component: String,
    /// Store the shadow's held effects to run (deduplicated by identity);
    /// by default they are dropped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub run_held_effects: bool,
}

/// What a promotion or discard did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShadowEnded {
    /// The component.
    pub component: String,
    /// The shadow's version.
    pub digest: String,
    /// `promoted` or `discarded`.
    pub outcome: String,
    /// Promoted: the checkpoint the instance switched at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_offset: Option<u64>,
    /// Promoted: how many held effects were stored to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effects_stored: Option<u64>,
}

fn shadow_not_found(stream: &StreamAddress, component: &str) -> Error {
    Error::not_found(
        "shadow-not-found",
        format!(
            "processor {component:?} on stream {:?} has no shadow (deploy one with \
             PUT .../components/{component}?refold=shadow)",
            stream.path
        ),
    )
}

impl Host {
    async fn shadow_instance(
        &self,
        stream: &StreamAddress,
        component: &str,
    ) -> Result<std::sync::Arc<fold::Instance>, Error> {
        shadow::instance(
            &self.streams,
            stream,
            component,
            self.config.delivery.timeout_ms,
        )
        .await
        .map_err(|e| Error::internal(format!("finding the shadow failed: {e:#}")))?
        .ok_or_else(|| shadow_not_found(stream, component))
    }

    /// The shadow of processor `component` on `stream` against the live
    /// instance: `catching-up` until it has folded through the live
    /// checkpoint, then `ready` with the state's RFC 6902 diff and the
    /// keys' diff; its held effects either way.
    pub async fn processor_shadow(
        &self,
        stream: &StreamAddress,
        component: &str,
    ) -> Result<ShadowView, Error> {
        match self
            .apply(
                stream,
                StreamRequest::Shadow {
                    component: component.to_string(),
                },
            )
            .await?
        {
            StreamAnswer::Shadow(x) => Ok(*x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::processor_shadow`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn processor_shadow_here(
        &self,
        stream: &StreamAddress,
        component: &str,
    ) -> Result<ShadowView, Error> {
        let instance = self.shadow_instance(stream, component).await?;
        self.on_blocking_thread(stream, component, "showing the shadow", move |stepper| {
            fold::view(stepper, &instance)
        })
        .await
    }

    /// Runs `work` over the instance of `component` on `stream` on a
    /// blocking thread (guests and storage run there); its failure is
    /// `422 shadow-failed`.
    async fn on_blocking_thread<T: Send + 'static>(
        &self,
        stream: &StreamAddress,
        component: &str,
        what: &'static str,
        work: impl FnOnce(&fold::Stepper<'_>) -> Result<T, crate::delivery::Failure> + Send + 'static,
    ) -> Result<T, Error> {
        let state = self.streams.state(stream).await?;
        let exec = self.streams.executors().clone();
        let project = stream.namespace.storage_key().to_string();
        let component = component.to_string();
        let timeout_ms = self.config.delivery.timeout_ms;
        tokio::task::spawn_blocking(move || {
            work(&fold::Stepper {
                storage: &exec.storage,
                runtime: &exec.runtime,
                project: &project,
                state: &state,
                component: &component,
                timeout_ms,
                limits: exec.bounds.jsonata,
            })
        })
        .await
        .map_err(|e| Error::internal(format!("{what} panicked: {e}")))?
        .map_err(|f| Error::unprocessable("shadow-failed", f.message))
    }

    /// Switches the instance of `promote.component` on `stream` to its
    /// shadow in one write (the shadow folds what the live version folded
    /// since, first). Its held effects are dropped unless
    /// `run_held_effects`.
    pub async fn promote_shadow(
        &self,
        stream: &StreamAddress,
        promote: Promote,
    ) -> Result<ShadowEnded, Error> {
        match self
            .apply(stream, StreamRequest::PromoteShadow(promote))
            .await?
        {
            StreamAnswer::ShadowEnded(x) => Ok(x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::promote_shadow`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn promote_shadow_here(
        &self,
        stream: &StreamAddress,
        promote: Promote,
    ) -> Result<ShadowEnded, Error> {
        let instance = self.shadow_instance(stream, &promote.component).await?;
        let fence = self.streams.fence(stream).await?;
        let promotion = Promotion {
            run_held: promote.run_held_effects,
            fence,
            now_ms: self.streams.now_ms(),
        };
        let i = std::sync::Arc::clone(&instance);
        let (through, held) = self
            .on_blocking_thread(
                stream,
                &promote.component,
                "promoting the shadow",
                move |stepper| {
                    let through = fold::promote(stepper, &i, &promotion)?;
                    Ok((through, i.held_count()))
                },
            )
            .await?;
        shadow::end(
            &self.streams,
            stream,
            &promote.component,
            &instance.digest,
            true,
        )
        .await;
        self.streams.executors().effects.ring();
        // The instance's next wake runs the new version.
        self.streams.wake(stream).await;
        Ok(ShadowEnded {
            component: promote.component,
            digest: instance.digest.clone(),
            outcome: "promoted".to_string(),
            checkpoint_offset: Some(through),
            effects_stored: Some(if promote.run_held_effects { held } else { 0 }),
        })
    }

    /// Drops the shadow of processor `component` on `stream`; the live
    /// instance is untouched.
    pub async fn discard_shadow(
        &self,
        stream: &StreamAddress,
        component: &str,
    ) -> Result<ShadowEnded, Error> {
        match self
            .apply(
                stream,
                StreamRequest::DiscardShadow {
                    component: component.to_string(),
                },
            )
            .await?
        {
            StreamAnswer::ShadowEnded(x) => Ok(x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::discard_shadow`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn discard_shadow_here(
        &self,
        stream: &StreamAddress,
        component: &str,
    ) -> Result<ShadowEnded, Error> {
        let instance = self.shadow_instance(stream, component).await?;
        shadow::end(&self.streams, stream, component, &instance.digest, false).await;
        Ok(ShadowEnded {
            component: component.to_string(),
            digest: instance.digest.clone(),
            outcome: "discarded".to_string(),
            checkpoint_offset: None,
            effects_stored: None,
        })
    }
}
