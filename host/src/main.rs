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
    // A write past the file size limit (RLIMIT_FSIZE) fails with EFBIG and
    // answers `503 storage-full`, as a full disk does, instead of the
    // signal ending the process.
    // SAFETY: setting a signal's disposition to "ignore" at start, before
    // any other thread exists.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
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
