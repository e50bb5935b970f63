//! A project's webhook signing secrets (admin): a new one, the previous
//! retired.

use super::*;

#[derive(Debug, Subcommand)]
pub(crate) enum WebhookSecretCommand {
    /// Generate a new secret that signs the project's webhooks from now on
    /// and print it (the only time it is shown); the previous one signs
    /// beside it until retired.
    Rotate(WebhookSecretArgs),
    /// Stop signing with the previous secret (the rotation is over).
    RetirePrevious(WebhookSecretArgs),
}

#[derive(Debug, Args)]
pub(crate) struct WebhookSecretArgs {
    #[command(flatten)]
    pub project: Project,
}

pub(super) async fn webhook_secret(command: WebhookSecretCommand) -> Result<()> {
    let (project, method, tail) = match command {
        WebhookSecretCommand::Rotate(a) => (a.project, reqwest::Method::PUT, "webhooks"),
        WebhookSecretCommand::RetirePrevious(a) => {
            (a.project, reqwest::Method::POST, "webhooks:retirePrevious")
        }
    };
    crate::stream::validate_project(&project.project).map_err(|e| anyhow::anyhow!(e.message))?;
    let call = mapping::ApiCall {
        method,
        path: format!("/v1/projects/{}/secrets/{tail}", project.project),
        query: String::new(),
        body: mapping::ApiBody::Empty,
        accept: None,
    };
    print_answer(api(&project.url, project.token.as_deref(), call).await?).await
}
