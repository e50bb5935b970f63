//! The secrets that sign a project's webhooks (Standard Webhooks; see
//! `executor/signature.rs`): a new one generated (the one before it keeps
//! signing until retired), the previous retired.

use serde::{Deserialize, Serialize};

use super::Host;
use crate::clock::format_timestamp;
use crate::error::Error;
use crate::executor::signature;
use crate::storage::{SecretChange, WriteOp};
use crate::stream::Namespace;

/// A project's new webhook signing secret (`whsec_` and base64), as
/// `PUT /v1/projects/{p}/secrets/webhooks` answers it: the only answer that
/// ever carries it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookSecret {
    /// The secret a receiver verifies signatures with.
    pub secret: String,
}

impl std::fmt::Debug for WebhookSecret {
    /// Never the secret itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret { .. }")
    }
}

/// What retiring a project's previous webhook secret did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousSecretRetired {
    /// Whether there was a previous secret (it no longer signs).
    pub retired: bool,
}

impl Host {
    /// Generates a new secret that signs `project`'s webhooks (subscription
    /// deliveries and webhook effects) from now on; the secret that signed
    /// them until now (if any) signs too, a second signature in the same
    /// header, until [`Host::retire_previous_webhook_secret`]. The answer
    /// is the only place the secret is ever shown.
    ///
    /// ```
    /// # use streamhost::{Config, Host};
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = Host::open(Config { data_dir: dir.path().to_path_buf(), ..Config::default() })?;
    /// let first = host.rotate_webhook_secret("acme").await?;
    /// assert!(first.secret.starts_with("whsec_"));
    /// let second = host.rotate_webhook_secret("acme").await?; // both sign now
    /// assert_ne!(first, second);
    /// assert!(host.retire_previous_webhook_secret("acme").await?.retired); // the second alone
    /// # Ok(()) }
    /// ```
    pub async fn rotate_webhook_secret(&self, project: &str) -> Result<WebhookSecret, Error> {
        Namespace::project(project)?;
        let secret = signature::generate();
        let at = format_timestamp(self.streams.clock().now_ms());
        let change = SecretChange::Rotate {
            secret: secret.clone(),
            at,
        };
        self.change_secrets(project, change).await?;
        Ok(WebhookSecret { secret })
    }

    /// Stops signing `project`'s webhooks with the secret before the
    /// current one (the rotation is over: receivers verify with the new
    /// one). `retired` is false when there was none.
    pub async fn retire_previous_webhook_secret(
        &self,
        project: &str,
    ) -> Result<PreviousSecretRetired, Error> {
        Namespace::project(project)?;
        let changed = self
            .change_secrets(project, SecretChange::RetirePrevious)
            .await?;
        Ok(PreviousSecretRetired {
            retired: changed > 0,
        })
    }

    async fn change_secrets(&self, project: &str, change: SecretChange) -> Result<i64, Error> {
        let changed = self
            .streams
            .storage()
            .submit(WriteOp::WebhookSecret {
                project: project.to_string(),
                change,
            })
            .await
            .map_err(|_| Error::internal("the storage writer stopped"))?
            .map_err(|e| {
                Error::internal(format!(
                    "changing the webhook secrets of project {project:?} failed: {e}"
                ))
            })?;
        // This host signs with the change at once; others within a second.
        self.streams.executors().secrets.forget(project);
        Ok(changed)
    }
}
