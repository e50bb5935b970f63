//! `streamhost new processor`: a project scaffolded into a temp dir builds
//! on its own (outside this workspace), folds its sample offline, deploys to
//! a running server and changes its state there.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::{cli_json, run_cli, wait_for, Server};

#[tokio::test]
async fn a_scaffolded_processor_builds_alone_deploys_and_folds() {
    if crate::support::skipped_on_postgres(
        "a scaffold's build and fold do not depend on the engine",
    ) {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("payments");
    let dir_s = dir.to_str().unwrap();
    let (ok, _, err) = run_cli(&["new", "processor", "payments", "--dir", dir_s]);
    assert!(ok, "{err}");
    assert!(err.contains("cargo build --release"), "{err}");
    for f in [
        "Cargo.toml",
        ".cargo/config.toml",
        "src/lib.rs",
        "events.jsonl",
        "expected.json",
        "README.md",
    ] {
        assert!(dir.join(f).is_file(), "{f} was not written");
    }
    // Not over an existing project.
    let (ok, _, err) = run_cli(&["new", "processor", "payments", "--dir", dir_s]);
    assert!(!ok && err.contains("is not empty"), "{err}");
    let (ok, _, err) = run_cli(&["new", "processor", "Payments", "--dir", "/tmp/x"]);
    assert!(!ok && err.contains("\"Payments\" is invalid"), "{err}");

    // A plain `cargo build --release` in the project builds the component
    // (its own workspace; the target dir is shared across runs only to
    // save time).
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = root.join("target/scaffold-test");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--release", "--quiet"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo build failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wasm = target.join("wasm32-wasip2/release/payments.wasm");
    let wasm_s = wasm.to_str().unwrap();

    // The sample folds offline.
    let events = dir.join("events.jsonl");
    let (ok, out, err) = run_cli(&["fold", wasm_s, "--events", events.to_str().unwrap()]);
    assert!(ok, "{err}");
    let folded: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(folded["events"], 3, "{folded}");
    assert_eq!(folded["total"], 42.5, "{folded}");
    // And passes its test: the expected state, whatever the batch cuts.
    let expected = dir.join("expected.json");
    let (ok, out, err) = run_cli(&[
        "test",
        wasm_s,
        "--events",
        events.to_str().unwrap(),
        "--expect",
        expected.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("ok: the state is the expected one"), "{out}");

    // And it runs on a server.
    let s = Server::start();
    cli_json(&s, &["deploy", "payments", wasm_s]);
    cli_json(
        &s,
        &["subscribe", "/payments", "payments", "--wake", "payments"],
    );
    cli_json(
        &s,
        &[
            "append",
            "/payments",
            "--type",
            "events.example/payment-received",
            "--payload",
            r#"{"amount": 30}"#,
        ],
    );
    let mut state = Value::Null;
    wait_for(
        "the processor's state",
        Duration::from_secs(30),
        async || {
            let (status, p) = s
                .get("/v1/projects/acme/streams/payments:processors/payments")
                .await;
            state = p["state"].clone();
            status == 200 && state["total"] == 30.0
        },
    )
    .await;
    assert_eq!(
        state["byType"],
        Value::Null,
        "the state's fields are as the fold names them"
    );
    assert_eq!(
        state["by_type"]["events.example/payment-received"], 1,
        "{state}"
    );
    // The stream's own events (its creation, the subscription) are not
    // folded unless the processor asks for them: 1 event, total 30.
    assert_eq!(state["events"], 1, "{state}");
    assert_eq!(
        state["by_type"].as_object().map(|m| m.len()),
        Some(1),
        "{state}"
    );
}

/// Runs `program args` in `dir` with the test's `streamhost` first on the
/// PATH (as a user who installed it has it); asserts it succeeded.
fn run_in(dir: &Path, program: &str, args: &[&str]) -> String {
    let bin_dir = Path::new(crate::support::BIN).parent().unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("PATH", format!("{}:{path}", bin_dir.display()))
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} {args:?} in {} failed:\n{stdout}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `streamhost new NAME --lang ts` and `--lang python`, followed as their
/// READMEs say: install, build, `streamhost test` green. (Components in
/// these languages on a server: `languages.rs`.)
#[tokio::test]
async fn typescript_and_python_projects_build_as_their_readmes_say_and_pass_their_test() {
    if crate::support::skipped_on_postgres(
        "a scaffold's build and fold do not depend on the engine",
    ) {
        return;
    }
    // The pinned tools, installed as the language examples have them.
    crate::support::language_guest("examples/js/dist/counter.wasm");
    let work = tempfile::tempdir().unwrap();
    for lang in ["ts", "python"] {
        let name = format!("pay-{lang}");
        let dir = work.path().join(&name);
        let (ok, _, err) = run_cli(&["new", &name, "--lang", lang, "--dir", dir.to_str().unwrap()]);
        assert!(ok, "{err}");
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        if lang == "ts" {
            assert!(err.contains("npm run build"), "{err}");
            assert!(readme.contains("npm install\nnpm run build"), "{readme}");
            run_in(
                &dir,
                "npm",
                &["install", "--no-audit", "--no-fund", "--prefer-offline"],
            );
            run_in(&dir, "npm", &["run", "build"]);
            run_in(&dir, "npm", &["run", "check"]);
            let tested = run_in(&dir, "npm", &["test"]);
            assert!(
                tested.contains("ok: the state is the expected one"),
                "{tested}"
            );
        } else {
            let build = format!("python -m streamhost_guest build processor -o {name}.wasm");
            assert!(readme.contains(&build), "{readme}");
            run_in(&dir, "python3", &["-m", "venv", ".venv"]);
            let python = dir.join(".venv/bin/python");
            let python = python.to_str().unwrap();
            run_in(
                &dir,
                python,
                &["-m", "pip", "install", "--quiet", "-r", "requirements.txt"],
            );
            run_in(
                &dir,
                python,
                &[
                    "-m",
                    "streamhost_guest",
                    "build",
                    "processor",
                    "-o",
                    &format!("{name}.wasm"),
                ],
            );
            let tested = run_in(
                &dir,
                "streamhost",
                &[
                    "test",
                    &format!("{name}.wasm"),
                    "--events",
                    "events.jsonl",
                    "--expect",
                    "expected.json",
                ],
            );
            assert!(
                tested.contains("ok: the state is the expected one"),
                "{tested}"
            );
        }
    }
}
