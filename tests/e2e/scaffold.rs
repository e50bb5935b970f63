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

    // It starts from the versions the checkout's example guests are built
    // with: its first build resolves nothing anew.
    let lock = std::fs::read_to_string(dir.join("Cargo.lock")).expect("a Cargo.lock");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let examples = std::fs::read_to_string(root.join("examples/processors/Cargo.lock")).unwrap();
    let serde_at = |lock: &str| {
        let at = lock
            .find("name = \"serde\"\nversion = ")
            .expect("serde is locked");
        lock[at..].lines().nth(1).unwrap().to_string()
    };
    assert_eq!(serde_at(&lock), serde_at(&examples), "{lock}");
    assert!(
        !lock.contains("name = \"counter\""),
        "only what it depends on: {lock}"
    );

    // A plain `cargo build --release` in the project builds the component
    // into its own target/ (its own workspace; its intermediate files where
    // the example guests' build keeps theirs, to compile the dependencies
    // they share once).
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--release", "--quiet"])
        .current_dir(&dir)
        .env_remove("CARGO_TARGET_DIR")
        .env(
            "CARGO_BUILD_BUILD_DIR",
            root.join("examples/processors/target"),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo build failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = std::fs::read_to_string(dir.join("Cargo.lock")).unwrap();
    assert_eq!(serde_at(&after), serde_at(&examples), "kept: {after}");
    let wasm = dir.join("target/wasm32-wasip2/release/payments.wasm");
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
