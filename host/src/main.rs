//! The `streamhost` binary: see `streamhost --help`.

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // A panic inside the host is a broken invariant: the process stops.
    streamhost::stop_on_broken_invariant();
    let cli = streamhost::cli::Cli::parse();
    if let Err(e) = streamhost::cli::run(cli).await {
        if streamhost::cli::is_broken_pipe(&e) {
            return; // `| head` closed stdout: nothing more to say.
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Counts allocations per thread for the JSONata allocation budget.
#[global_allocator]
static ALLOCATOR: streamhost::CountingAllocator = streamhost::CountingAllocator;
