//! The docs' shell blocks run as written against a real server: every
//! ```sh block of README.md and docs/http-api.md, in order, each in one
//! bash, with `streamhost` on the PATH and the server's address for
//! `localhost:7410`.

use std::path::Path;
use std::process::Command;

use crate::support::{Server, BIN};

/// The blocks the harness itself stands for: starting a server (the test
/// starts one) and running the tests (this is one).
const HARNESS: &[&str] = &[
    "cargo run --release -p streamhost -- serve",
    "./scripts/test",
];

/// A command that streams until stopped (`curl -N` on `:connect`, `tail`
/// without `--count` or `--until-offset`) runs for two seconds; being
/// stopped then (exit 124) is its success.
fn bounded(line: &str) -> String {
    let streams = line.starts_with("curl -N ")
        || (line.starts_with("streamhost tail")
            && !line.contains("--count")
            && !line.contains("--until-offset"));
    if streams {
        format!("{{ timeout 2 {line} || [ $? -eq 124 ]; }}")
    } else {
        line.to_string()
    }
}

#[test]
fn every_shell_command_of_the_readme_runs_as_written() {
    if crate::support::skipped_on_postgres(
        "the README is run as a user runs it, on the default engine",
    ) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The guests the blocks name, built as `scripts/test` builds them.
    crate::support::guest("counter");
    crate::support::language_guest("examples/js/dist/counter.wasm");
    let (ran, skipped) = run_shell_blocks(&root.join("README.md"), &root, HARNESS);
    let _ = std::fs::remove_file(root.join("events.jsonl"));
    assert_eq!(
        skipped, HARNESS,
        "the harness blocks are still in the README"
    );
    assert!(ran >= 8, "only {ran} blocks ran");
}

#[test]
fn every_curl_example_of_the_http_reference_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The reference's examples run where the component files they send
    // are (`--data-binary @kinds.wasm`).
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        work.path().join("kinds.wasm"),
        crate::support::guest("kinds"),
    )
    .unwrap();
    let (ran, skipped) = run_shell_blocks(&root.join("docs/http-api.md"), work.path(), &[]);
    assert!(skipped.is_empty());
    assert!(ran >= 6, "only {ran} blocks ran");
}

/// npm's and pip's caches of the user running the tests, for blocks that
/// run with a `HOME` of their own.
fn package_caches() -> Vec<(&'static str, std::path::PathBuf)> {
    let Some(home) = std::env::var_os("HOME").map(std::path::PathBuf::from) else {
        return Vec::new();
    };
    vec![
        ("npm_config_cache", home.join(".npm")),
        ("PIP_CACHE_DIR", home.join(".cache/pip")),
    ]
}

/// Runs every ```sh block of `markdown` in order, each in one bash in
/// `dir`, against one server; a block that fails or answers an error fails
/// the test. Blocks holding one of `harness` are skipped. Answers the
/// number run and the harness lines skipped.
fn run_shell_blocks(
    markdown: &Path,
    dir: &Path,
    harness: &[&'static str],
) -> (usize, Vec<&'static str>) {
    let text = std::fs::read_to_string(markdown).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let s = rt.block_on(async { Server::start() });
    let address = s.url.trim_start_matches("http://").to_string();
    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let home = tempfile::tempdir().unwrap();
    // A project the blocks build under $HOME (`streamhost new`, then
    // `cargo build`) keeps its intermediate files where the example guests'
    // build keeps theirs (as `scaffold.rs` does): it starts from their
    // versions (its Cargo.lock), so their compiled dependencies serve it
    // (the macros' above all); its own `target/` still holds what it builds.
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/processors/target");
    std::fs::create_dir_all(home.path().join(".cargo")).unwrap();
    std::fs::write(
        home.path().join(".cargo/config.toml"),
        format!("[build]\nbuild-dir = {:?}\n", shared.display().to_string()),
    )
    .unwrap();
    let mut ran = 0;
    let mut skipped = Vec::new();
    for block in text.split("```sh\n").skip(1) {
        let block = block.split("```").next().unwrap();
        if let Some(h) = harness.iter().find(|h| block.contains(*h)) {
            skipped.push(*h);
            continue;
        }
        let script: String = block
            .replace("localhost:7410", &address)
            .lines()
            .map(|l| format!("{}\n", bounded(l)))
            .collect();
        // A block that waits forever (a command that never ends) fails
        // after five minutes instead of hanging the suite.
        let started = std::time::Instant::now();
        let out = Command::new("timeout")
            .args(["300", "bash", "-e", "-o", "pipefail", "-c", &script])
            .current_dir(dir)
            .env("PATH", &path)
            .env("STREAMHOST_URL", &s.url)
            .env("HOME", home.path())
            // The TypeScript and Python blocks install their tools as a
            // user does; from the caches the language guests' builds
            // filled, not the network again.
            .envs(package_caches())
            // Offline folds and the server share compiled components.
            .env(
                "STREAMHOST_COMPILE_CACHE_DIR",
                crate::support::shared_compile_cache(),
            )
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .expect("running bash");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let name = markdown.display();
        // Where the test's time goes (printed when it fails, or with
        // `--no-capture`).
        eprintln!(
            "{name}, block {} ({}): {:.1} s",
            ran + skipped.len() + 1,
            block.lines().next().unwrap_or_default(),
            started.elapsed().as_secs_f64()
        );
        assert!(
            out.status.success(),
            "this block of {name} failed:\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        );
        // curl exits 0 on an HTTP error: its answers must not be errors.
        assert!(
            !stdout.contains("{\"error\":"),
            "this block of {name} answered an error:\n{script}\n--- stdout\n{stdout}"
        );
        ran += 1;
    }
    (ran, skipped)
}
