//! `streamhost new` (scaffolding) and shell completions.

use super::*;

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Subcommand)]
pub(crate) enum NewCommand {
    /// A standalone processor project: a working fold, a sample of events,
    /// a README; `cargo build --release` in it builds the component.
    Processor(NewProcessorArgs),
}

#[derive(Debug, Args)]
pub(crate) struct NewProcessorArgs {
    /// The processor's name (the crate, the component): lowercase letters,
    /// digits and '-'.
    pub name: String,
    /// Where to create it [default: ./NAME]; must not exist or be empty.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Use the guest SDK at this path (a checkout's guest-sdk/) [default:
    /// the SDK of the repository this binary was built from].
    #[arg(long, conflicts_with = "sdk_git")]
    pub sdk_path: Option<PathBuf>,
    /// Use the guest SDK from this git repository.
    #[arg(long)]
    pub sdk_git: Option<String>,
}

pub(super) fn new_processor(a: NewProcessorArgs) -> Result<()> {
    use crate::scaffold::{self, Sdk};
    let sdk = match (a.sdk_path, a.sdk_git) {
        (Some(p), _) => {
            if !p.join("Cargo.toml").is_file() {
                bail!(
                    "--sdk-path {} holds no Cargo.toml: name a checkout's guest-sdk/",
                    p.display()
                );
            }
            Sdk::Path(p.canonicalize().unwrap_or(p))
        }
        (None, Some(url)) => Sdk::Git(url),
        (None, None) => Sdk::of_this_build().with_context(|| {
            "the guest SDK this binary was built with is gone: pass --sdk-path PATH \
             (a checkout's guest-sdk/) or --sdk-git URL"
        })?,
    };
    let dir = a.dir.unwrap_or_else(|| PathBuf::from(&a.name));
    let written = scaffold::write(&dir, &a.name, &sdk)?;
    for path in &written {
        eprintln!("created {}", path.display());
    }
    eprintln!(
        "\nnext:\n  cd {}\n  cargo build --release\n  streamhost fold target/wasm32-wasip2/release/{}.wasm --events events.jsonl\n(see its README.md for deploying it)",
        dir.display(),
        a.name.replace('-', "_")
    );
    Ok(())
}
