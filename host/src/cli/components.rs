//! Commands on components: deploy, download, ITX calls.

use super::*;

#[derive(Debug, Args)]
pub(crate) struct DeployArgs {
    #[command(flatten)]
    pub component: ComponentRef,
    /// The component (.wasm).
    pub file: PathBuf,
    /// Refold every processor instance of it from the new version's initial
    /// state (the old state serves reads until the new one has caught up).
    #[arg(long)]
    pub refold: bool,
    /// With --refold: store the effects the new version returns for events
    /// the old version already folded (by default they are dropped: they
    /// ran under the old version).
    #[arg(long, requires = "refold")]
    pub replay_effects: bool,
    /// Fold the new version beside the current one, which keeps serving:
    /// compare with `streamhost shadow show`, then `shadow promote` or
    /// `shadow discard` each instance.
    #[arg(long, conflicts_with = "refold")]
    pub shadow: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ComponentCommand {
    /// Download a deployed component's .wasm (to run a repro command locally).
    Get(ComponentGetArgs),
    /// The versions of a component, newest first: digest, deployedAt.
    Versions(ComponentRef),
}

#[derive(Debug, Args)]
pub(crate) struct ComponentGetArgs {
    #[command(flatten)]
    pub component: ComponentRef,
    /// Where to write it (default: NAME.wasm in the current directory).
    #[arg(long = "to", short = 'o', value_name = "FILE")]
    pub to: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct ItxArgs {
    #[command(flatten)]
    pub project: Project,
    /// The ITX expression as JSON: `'["components", ["get", "kinds"], "add"]'`.
    pub expression: String,
    /// The arguments, each as JSON (`1 2`, `'{"a": 1}'`).
    pub args: Vec<String>,
}

pub(super) async fn component_get(a: ComponentGetArgs) -> Result<()> {
    let bytes = ComponentRequest::Bytes {
        name: a.component.name.clone(),
    };
    let response = component_call(&a.component.project, &bytes).await?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        return Err(api_error(status, &text));
    }
    let bytes = response.bytes().await.context("reading the component")?;
    let path =
        a.to.unwrap_or_else(|| PathBuf::from(format!("{}.wasm", a.component.name)));
    std::fs::write(&path, &bytes).with_context(|| format!("writing {}", path.display()))?;
    print_line(&format!(
        "wrote {} bytes to {}",
        bytes.len(),
        path.display()
    ))
}

/// `streamhost itx`: `POST /v1/projects/{p}/itx`.
pub(super) async fn itx(a: ItxArgs) -> Result<()> {
    let expression: Value = serde_json::from_str(&a.expression)
        .with_context(|| format!("the expression {:?} is not JSON", a.expression))?;
    let args = a
        .args
        .iter()
        .enumerate()
        .map(|(i, text)| {
            serde_json::from_str::<Value>(text)
                .with_context(|| format!("argument {} {text:?} is not JSON", i + 1))
        })
        .collect::<Result<Vec<_>>>()?;
    let call = mapping::render_itx(&a.project.project, &ItxRequest { expression, args });
    print_answer(api(&a.project.url, a.project.token.as_deref(), call).await?).await
}

pub(super) async fn deploy(a: DeployArgs) -> Result<()> {
    let bytes = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let label = format!(
        "deploying {} ({} KiB; the server validates it and compiles it in the background)",
        a.component.name,
        bytes.len() / 1024
    );
    let refold = if a.shadow {
        Some("shadow")
    } else {
        a.refold.then_some("true")
    };
    let mode = crate::component::DeployMode::from_options(refold, a.replay_effects)
        .map_err(anyhow::Error::msg)?;
    let deploy = ComponentRequest::Deploy {
        name: a.component.name.clone(),
        bytes,
        mode,
    };
    let response = with_progress(&label, component_call(&a.component.project, &deploy)).await?;
    print_answer(response).await
}
