//! The processor outbox: list, show, retry, cancel effects.

use super::*;

#[derive(Debug, Subcommand)]
pub(crate) enum EffectsCommand {
    /// List effects, oldest first (a page; --after-id continues).
    Ls(EffectsLsArgs),
    /// One effect, with its target, attempts, last error and result.
    Show(EffectShowArgs),
    /// Run a failed or cancelled effect again (attempts reset).
    Retry(EffectArgs),
    /// Cancel a pending or failed effect.
    Cancel(EffectArgs),
}

#[derive(Debug, Args)]
pub(crate) struct EffectsLsArgs {
    #[command(flatten)]
    pub project: Project,
    /// Only effects of processors on this source stream (such as /orders).
    #[arg(long)]
    pub stream: Option<String>,
    /// Only effects of this processor component.
    #[arg(long)]
    pub component: Option<String>,
    /// Only effects in this status: pending, running, succeeded, failed, cancelled.
    #[arg(long)]
    pub status: Option<String>,
    /// Only effects that will run by this time (RFC 3339 or ms since the
    /// epoch): pending ones due at or before it.
    #[arg(long, value_parser = crate::clock::parse_time)]
    pub due_before: Option<i64>,
    /// Start after this effect id (the `nextAfterId` of the previous page).
    #[arg(long)]
    pub after_id: Option<u64>,
    /// Effects per page (1 to 500).
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
}

#[derive(Debug, Args)]
pub(crate) struct EffectArgs {
    #[command(flatten)]
    pub project: Project,
    /// The effect id.
    pub id: u64,
}

#[derive(Debug, Args)]
pub(crate) struct EffectShowArgs {
    #[command(flatten)]
    pub effect: EffectArgs,
    /// Wait until the effect exists and has settled (succeeded, failed or
    /// cancelled), up to --timeout-ms.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits, in ms.
    #[arg(long, default_value_t = 30_000)]
    pub timeout_ms: u64,
}

pub(super) async fn effects(command: EffectsCommand) -> Result<()> {
    use crate::host::effects::{EffectFilter, EffectStatus};
    let (project, request) = match command {
        EffectsCommand::Ls(a) => {
            let mut filter = EffectFilter::new().limit(a.limit);
            filter.stream = a.stream;
            filter.component = a.component;
            if let Some(status) = &a.status {
                let parsed = EffectStatus::parse(status).ok_or_else(|| {
                    let all: Vec<&str> = EffectStatus::ALL.iter().map(|s| s.as_str()).collect();
                    anyhow::anyhow!(
                        "--status {status:?} is not an effect status ({})",
                        all.join(", ")
                    )
                })?;
                filter.status = Some(parsed);
            }
            filter.due_before_ms = a.due_before;
            filter.after_id = a.after_id.unwrap_or(0) as i64;
            (a.project, EffectRequest::List(filter))
        }
        EffectsCommand::Show(a) if a.wait => return effect_settled(&a).await,
        EffectsCommand::Show(a) => (
            a.effect.project,
            EffectRequest::Get {
                id: a.effect.id as i64,
            },
        ),
        EffectsCommand::Retry(a) => (a.project, EffectRequest::Retry { id: a.id as i64 }),
        EffectsCommand::Cancel(a) => (a.project, EffectRequest::Cancel { id: a.id as i64 }),
    };
    let call = mapping::render_effect(&project.project, &request);
    print_answer(api(&project.url, project.token.as_deref(), call).await?).await
}

/// `streamhost effects show --wait`: the effect once it has settled.
pub(super) async fn effect_settled(a: &EffectShowArgs) -> Result<()> {
    let project = &a.effect.project;
    let get = EffectRequest::Get {
        id: a.effect.id as i64,
    };
    let what = format!("effect {} did not settle", a.effect.id);
    let e = poll(a.timeout_ms, &what, || async {
        let call = mapping::render_effect(&project.project, &get);
        let answer = api(&project.url, project.token.as_deref(), call).await?;
        Ok(match answer_json(answer).await? {
            None => Err("it does not exist yet".to_string()),
            Some(e)
                if ["succeeded", "failed", "cancelled"]
                    .contains(&e["status"].as_str().unwrap_or("")) =>
            {
                Ok(e)
            }
            Some(e) => Err(format!("it is {}", e["status"])),
        })
    })
    .await?;
    print_line(&render(&e))
}
