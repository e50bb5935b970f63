//! `streamhost new` (scaffolding) and shell completions.

use super::*;

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

/// `streamhost new NAME [--lang ...]`, or `streamhost new processor NAME`
/// as before.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct NewArgs {
    #[command(subcommand)]
    pub command: Option<NewCommand>,
    #[command(flatten)]
    pub processor: Option<NewProcessorArgs>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum NewCommand {
    /// A standalone processor project (the same as `streamhost new NAME`).
    Processor(NewProcessorArgs),
}

#[derive(Debug, Args)]
pub(crate) struct NewProcessorArgs {
    /// The processor's name (the project, the component): lowercase
    /// letters, digits and '-'.
    pub name: String,
    /// The language: rust (cargo), ts or js (npm: esbuild and
    /// componentize-js), python (componentize-py).
    #[arg(long, value_enum, default_value = "rust")]
    pub lang: crate::scaffold::Lang,
    /// Where to create it [default: ./NAME]; must not exist or be empty.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Use the guest SDK at this path (a checkout's guest-sdk/, or
    /// guest-sdk/js/, guest-sdk/python/) [default: the SDK of the
    /// repository this binary was built from].
    #[arg(long, conflicts_with = "sdk_git")]
    pub sdk_path: Option<PathBuf>,
    /// Use the guest SDK from this git repository (Rust and Python).
    #[arg(long)]
    pub sdk_git: Option<String>,
}

pub(super) fn new_project(a: NewArgs) -> Result<()> {
    match (a.command, a.processor) {
        (Some(NewCommand::Processor(p)), _) | (None, Some(p)) => new_processor(p),
        (None, None) => bail!("name the project: streamhost new NAME [--lang rust|ts|js|python]"),
    }
}

fn new_processor(a: NewProcessorArgs) -> Result<()> {
    use crate::scaffold::{self, Lang, Sdk};
    let sdk = match (a.sdk_path, a.sdk_git) {
        (Some(p), _) => {
            a.lang.check_sdk_path(&p)?;
            Sdk::Path(p.canonicalize().unwrap_or(p))
        }
        (None, Some(url)) => {
            if matches!(a.lang, Lang::Ts | Lang::Js) {
                bail!(
                    "--sdk-git does not work for --lang {:?}: npm installs no subdirectory of a \
                     git repository; clone it and pass --sdk-path CLONE/guest-sdk/js",
                    a.lang
                );
            }
            Sdk::Git(url)
        }
        (None, None) => Sdk::of_this_build(a.lang).with_context(|| {
            "the guest SDK this binary was built with is gone: pass --sdk-path PATH \
             (a checkout's guest-sdk/, guest-sdk/js/ or guest-sdk/python/) or --sdk-git URL"
        })?,
    };
    let dir = a.dir.unwrap_or_else(|| PathBuf::from(&a.name));
    let written = scaffold::write(&dir, a.lang, &a.name, &sdk)?;
    for path in &written {
        eprintln!("created {}", path.display());
    }
    eprintln!(
        "\nnext:\n  cd {}\n{}\n(see its README.md for deploying it)",
        dir.display(),
        a.lang.next_steps(&a.name)
    );
    Ok(())
}
