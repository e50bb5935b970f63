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
