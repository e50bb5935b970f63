//! The command line: client commands against a running server, and config
//! errors at start.

use std::process::Command;

use serde_json::Value;

use crate::support::{file_in, run_cli, Server, BIN};

#[tokio::test]
async fn append_events_and_state_commands() {
    let s = Server::start();
    let (ok, out, err) = run_cli(&[
        "append",
        "--url",
        &s.url,
        "--project",
        "acme",
        "/cli/s",
        "--type",
        "x.y/a",
        "--payload",
        r#"{"n": 1}"#,
        "--idempotency-key",
        "k1",
    ]);
    assert!(ok, "{err}");
    let appended: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(appended["events"][0]["offset"], 2);
    assert_eq!(appended["events"][0]["payload"]["n"], 1);

    let (ok, out, err) = run_cli(&["events", "--url", &s.url, "--project", "acme", "/cli/s"]);
    assert!(ok, "{err}");
    let page: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(page["events"].as_array().unwrap().len(), 2);

    let (ok, out, err) = run_cli(&["state", "--url", &s.url, "--project", "acme", "/cli/s"]);
    assert!(ok, "{err}");
    let state: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(state["eventCount"], 2);

    // Errors from the server reach the user with their code and message.
    let (ok, _, err) = run_cli(&[
        "state",
        "--url",
        &s.url,
        "--project",
        "acme",
        "/cli/missing",
    ]);
    assert!(!ok);
    assert!(
        err.contains("stream-not-found") && err.contains("/cli/missing"),
        "{err}"
    );
    let (ok, _, err) = run_cli(&[
        "append",
        "--url",
        &s.url,
        "--project",
        "acme",
        "/cli/s",
        "--type",
        "x.y/a",
        "--payload",
        "[1]",
    ]);
    assert!(!ok);
    assert!(err.contains("--payload"), "{err}");
}

#[test]
fn bad_config_stops_the_server_naming_the_key_or_value() {
    let dir = tempfile::tempdir().unwrap();
    for (text, mention) in [
        ("listen = \"127.0.0.1:0\"\nfsync = true\n", "fsync"),
        ("durability = \"eventually\"\n", "eventually"),
        ("[delivery]\ntimeout-ms = 0\n", "timeout-ms"),
    ] {
        let path = file_in(dir.path(), "bad.toml");
        std::fs::write(&path, text).unwrap();
        let out = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(mention),
            "stderr should name {mention:?}: {err}"
        );
    }
}

#[tokio::test]
async fn tail_prints_matching_events_as_they_arrive() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let s = Server::start();
    s.post(
        "/v1/projects/acme/streams/t:append",
        serde_json::json!({"events": [
            {"type": "x.y/a", "payload": {"n": 1}}, {"type": "x.y/b", "payload": {"n": 2}}
        ]}),
    )
    .await;
    let mut child = Command::new(BIN)
        .args([
            "tail",
            "--url",
            &s.url,
            "--project",
            "acme",
            "/t",
            "--after",
            "0",
            "--type",
            "x.y/a",
            "--where",
            "payload.n > 0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next = || -> Value {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("a line from tail");
        serde_json::from_str(&line).unwrap()
    };
    assert_eq!(next()["payload"]["n"], 1, "replayed");
    s.post(
        "/v1/projects/acme/streams/t:append",
        serde_json::json!({"events": [
            {"type": "x.y/a", "payload": {"n": -1}}, {"type": "x.y/a", "payload": {"n": 3}}
        ]}),
    )
    .await;
    assert_eq!(next()["payload"]["n"], 3, "live, filtered");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn fold_folds_offline_and_prints_a_wave_repro_command_on_failure() {
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter.wasm");
    std::fs::write(&counter, crate::support::guest("counter")).unwrap();
    let events = dir.path().join("events.jsonl");
    std::fs::write(
        &events,
        "{\"type\": \"x.y/n\", \"payload\": {\"n\": 2}}\n\n{\"type\": \"x.y/n\", \"payload\": {\"n\": 3}, \"offset\": 7}\n",
    )
    .unwrap();
    let (ok, out, err) = run_cli(&[
        "fold",
        counter.to_str().unwrap(),
        "--events",
        events.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let state: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        state,
        serde_json::json!({"events": 2, "sum": 5, "last_offset": 7})
    );
    let start = dir.path().join("state.json");
    std::fs::write(&start, out).unwrap();
    let (ok, out, _) = run_cli(&[
        "fold",
        counter.to_str().unwrap(),
        "--events",
        events.to_str().unwrap(),
        "--state",
        start.to_str().unwrap(),
    ]);
    assert!(ok);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["sum"], 10);

    let hostile = dir.path().join("hostile.wasm");
    std::fs::write(&hostile, crate::support::guest("hostile")).unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"type\": \"hostile/trap\", \"payload\": {\"why\": \"it's 'quoted'\"}}\n",
    )
    .unwrap();
    let (ok, _, err) = run_cli(&[
        "fold",
        hostile.to_str().unwrap(),
        "--events",
        bad.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("the guest trapped"), "{err}");
    let command = err
        .split("reproduce with: ")
        .nth(1)
        .expect("a repro command")
        .trim();
    assert!(
        command.ends_with(&format!(" {}", hostile.display())),
        "{command}"
    );
    crate::hostile::assert_valid_wave_fold_call(command);

    let (ok, _, err) = run_cli(&[
        "fold",
        events.to_str().unwrap(),
        "--events",
        events.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("not a valid WebAssembly component"), "{err}");
}

#[tokio::test]
async fn deploy_and_verify_commands() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter.wasm");
    std::fs::write(&counter, crate::support::guest("counter")).unwrap();
    let (ok, out, err) = run_cli(&[
        "deploy",
        "--url",
        &s.url,
        "--project",
        "acme",
        "counter",
        counter.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("sha256:"), "{out}");
    s.post("/v1/projects/acme/streams/v:append", serde_json::json!({"events": [
        {"type": "events.iterate.com/stream/subscription-configured", "payload": {"subscriptionKey": "c",
            "receiver": {"action": "processor-wake", "expression": ["components", ["get", "counter"], "wake"]}}},
        {"type": "x.y/n", "payload": {"n": 4}}
    ]}))
    .await;
    crate::processors::caught_up(&s, "/v1/projects/acme/streams/v", "counter").await;
    let (ok, out, err) = run_cli(&[
        "verify",
        "--url",
        &s.url,
        "--project",
        "acme",
        "/v",
        "counter",
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("\"matches\": true"), "{out}");
}

#[tokio::test]
async fn a_closed_pipe_ends_a_command_quietly() {
    let s = Server::start();
    // More output than a pipe holds (64 KiB), so the command is still
    // writing when the reader goes away.
    let events: Vec<Value> = (0..100)
        .map(|i| serde_json::json!({"type": "x.y/big", "payload": {"i": i, "pad": "x".repeat(2000)}}))
        .collect();
    let (status, out) = s
        .post(
            "/v1/projects/acme/streams/cli/big:append",
            serde_json::json!({ "events": events }),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let mut child = Command::new(BIN)
        .args(["events", "--url", &s.url, "--project", "acme", "/cli/big"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // `| head` that has read enough
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(err.trim().is_empty(), "nothing on stderr: {err}");
}

#[test]
fn help_never_shows_the_token() {
    for command in ["events", "deploy", "append", "tail"] {
        let out = Command::new(BIN)
            .args([command, "--help"])
            .env("STREAMHOST_TOKEN", "s3cret-token-value")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("STREAMHOST_TOKEN"), "{help}");
        assert!(!help.contains("s3cret-token-value"), "{command}: {help}");
    }
}

#[test]
fn an_unreachable_server_is_one_line_with_a_hint() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let (ok, _, err) = run_cli(&["events", "--url", &url, "--project", "acme", "/x"]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(&url), "{err}");
    assert!(
        err.contains("is it running? set --url or STREAMHOST_URL"),
        "{err}"
    );
}
