//! The command line: client commands against a running server, and config
//! errors at start.

use std::process::Command;

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{cli_json, cli_with, file_in, run_cli, Server, BIN};

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
    // One readable line: the code, the message, the status.
    assert_eq!(
        err.trim(),
        "error: stream-not-found: stream \"/cli/missing\" does not exist in project \"acme\" (404)"
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
        (
            "[[tokens]]\ntoken = \"t\"\nprojects = [\"acme\"]\nscope = \"write\"\n",
            "unknown variant `write`",
        ),
        (
            "[[tokens]]\ntoken = \"t\"\nadmin = true\nscope = \"append\"\n",
            "tokens[0] is an admin token with scope = \"append\"",
        ),
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

#[test]
fn test_checks_a_processor_over_fixture_events_and_names_a_counterexample() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let counter = dir.path().join("counter.wasm");
    std::fs::write(&counter, crate::support::guest("counter")).unwrap();
    let counter = counter.to_str().unwrap();
    let lines: String = (1..=12)
        .map(|n| format!("{{\"type\": \"x.y/n\", \"payload\": {{\"n\": {n}}}}}\n"))
        .collect();
    let events = write("events.jsonl", &lines);
    let expected = write(
        "expected.json",
        r#"{"events": 12, "sum": 78, "last_offset": 12}"#,
    );
    let (ok, out, err) = run_cli(&["test", counter, "--events", &events, "--expect", &expected]);
    assert!(ok, "{err}");
    for line in [
        "ok: folds 12 events without a trap",
        "ok: a second run ends in the same state",
        "ok: the same state whatever the batch cuts: whole batches and 20 random cuts (seed 1)",
        "ok: the state is the expected one",
    ] {
        assert!(out.contains(line), "{line:?} in {out}");
    }
    // The wrong expectation: named, both states shown.
    let wrong = write(
        "wrong.json",
        r#"{"events": 12, "sum": 77, "last_offset": 12}"#,
    );
    let (ok, _, err) = run_cli(&["test", counter, "--events", &events, "--expect", &wrong]);
    assert!(!ok);
    assert!(err.contains("not the expected one"), "{err}");
    assert!(
        err.contains("\"sum\":77") && err.contains("\"sum\":78"),
        "{err}"
    );

    // A fold that counts its calls: its state depends on the cuts.
    let hostile = dir.path().join("hostile.wasm");
    std::fs::write(&hostile, crate::support::guest("hostile")).unwrap();
    let cut = write(
        "cut.jsonl",
        "{\"type\": \"x.y/a\"}\n{\"type\": \"hostile/batch\"}\n{\"type\": \"x.y/b\"}\n{\"type\": \"hostile/batch\"}\n",
    );
    let (ok, _, err) = run_cli(&[
        "test",
        hostile.to_str().unwrap(),
        "--events",
        &cut,
        "--seed",
        "3",
    ]);
    assert!(!ok, "a cut-dependent fold passed");
    assert!(err.contains("depends on how the batches are cut"), "{err}");
    assert!(
        err.contains("cut #0 (batch sizes [4]"),
        "whole batches first: {err}"
    );
    assert!(err.contains("the batch, as a fixture (JSONL):"), "{err}");
    assert!(err.contains("hostile/batch"), "{err}");
    let command = err
        .split("reproduce with: ")
        .nth(1)
        .expect("a repro command")
        .lines()
        .next()
        .unwrap()
        .trim();
    assert!(
        command.starts_with("wasmtime run --invoke 'fold(")
            && command.ends_with(&format!(" {}", hostile.display())),
        "{command}"
    );

    // A trap: the failing batch and its repro.
    let bad = write("bad.jsonl", "{\"type\": \"hostile/trap\"}\n");
    let (ok, _, err) = run_cli(&["test", hostile.to_str().unwrap(), "--events", &bad]);
    assert!(!ok);
    assert!(err.contains("the guest trapped"), "{err}");
    assert!(err.contains("reproduce with: wasmtime run"), "{err}");
    // The repro traps the same way under the plain wasmtime CLI.
    let repro = err
        .split("reproduce with: ")
        .nth(1)
        .and_then(|r| r.lines().next())
        .expect("a repro command");
    let (ok, printed) = crate::support::run_repro(repro, dir.path());
    assert!(
        !ok && printed.contains("the hostile guest traps on purpose"),
        "{repro}\n{printed}"
    );
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
    let verified: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(verified["matches"], true, "{out}");
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
    let (_refusing, port) = crate::support::refusing_port();
    let url = format!("http://127.0.0.1:{port}");
    let (ok, _, err) = run_cli(&["events", "--url", &url, "--project", "acme", "/x"]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(&url), "{err}");
    assert!(
        err.contains("is it running? set --url or STREAMHOST_URL"),
        "{err}"
    );
}

/// `streamhost ARGS... --url URL --project acme`, parsed as JSON.

#[tokio::test]
async fn subscriptions_pausing_reset_and_health_from_the_command_line() {
    let s = Server::start();
    for i in 0..3 {
        let n = format!("{{\"n\": {i}}}");
        cli_json(
            &s,
            &["append", "/cli/src", "--type", "x.y/a", "--payload", &n],
        );
    }
    let configured = cli_json(
        &s,
        &[
            "subscribe",
            "/cli/src",
            "mirror",
            "--copy-to",
            "/cli/dst",
            "--start",
            "beginning",
            "--type",
            "x.y/a",
        ],
    );
    assert_eq!(
        configured["events"][0]["payload"]["receiver"]["receivingStreamPath"],
        "/cli/dst"
    );
    crate::support::wait_for(
        "the copies",
        std::time::Duration::from_secs(30),
        async || {
            // (The receiving stream exists once the first copy is committed.)
            let (status, page) = s
                .get("/v1/projects/acme/streams/cli/dst:events?afterOffset=0")
                .await;
            status == 200 && page["events"].as_array().map(Vec::len) == Some(4)
        },
    )
    .await;
    crate::support::wait_for(
        "the cursor to move",
        std::time::Duration::from_secs(30),
        async || {
            let runtime = cli_json(&s, &["runtime", "/cli/src"]);
            runtime["subscriptions"]["mirror"]["acknowledgedOffset"] == 5
        },
    )
    .await;
    let set = cli_json(
        &s,
        &["set-cursor", "/cli/src", "mirror", "--after-offset", "1"],
    );
    assert_eq!(
        set["subscriptionCursorSetEvent"]["payload"]["afterOffset"], 1,
        "{set}"
    );
    let resumed = cli_json(
        &s,
        &[
            "resume-subscription",
            "/cli/src",
            "mirror",
            "--after-offset",
            "2",
        ],
    );
    assert!(resumed["resumed"].is_object(), "{resumed}");
    let removed = cli_json(&s, &["unsubscribe", "/cli/src", "mirror"]);
    assert_eq!(
        removed["events"][0]["type"],
        "events.iterate.com/stream/subscription-removed"
    );

    // Pausing: appends are refused with a hint, until resumed.
    cli_json(&s, &["pause", "/cli/src", "--reason", "maintenance"]);
    let (ok, _, err) = run_cli(&[
        "append",
        "/cli/src",
        "--type",
        "x.y/a",
        "--url",
        &s.url,
        "--project",
        "acme",
    ]);
    assert!(!ok);
    assert!(err.contains("stream paused: maintenance"), "{err}");
    assert!(
        err.contains("hint:") && err.contains("streamhost resume"),
        "{err}"
    );
    assert_eq!(err.matches("hint:").count(), 1, "the hint once: {err}");
    assert!(!err.contains("{\"error\""), "no raw JSON: {err}");
    cli_json(&s, &["resume", "/cli/src"]);
    cli_json(&s, &["append", "/cli/src", "--type", "x.y/a"]);

    // Every page as JSON Lines; tail stops by count and by offset.
    let (ok, out, err) = run_cli(&[
        "events",
        "/cli/src",
        "--jsonl",
        "--limit",
        "2",
        "--url",
        &s.url,
        "--project",
        "acme",
    ]);
    assert!(ok, "{err}");
    let offsets: Vec<u64> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["offset"]
                .as_u64()
                .unwrap()
        })
        .collect();
    let head = s
        .all_events("/v1/projects/acme/streams/cli/src")
        .await
        .len() as u64;
    assert_eq!(offsets, (1..=head).collect::<Vec<_>>());
    for stop in [["--count", "3"], ["--until-offset", "3"]] {
        let (ok, out, err) = run_cli(&[
            "tail",
            "/cli/src",
            "--after-offset",
            "0",
            stop[0],
            stop[1],
            "--url",
            &s.url,
            "--project",
            "acme",
        ]);
        assert!(ok, "{err}");
        assert_eq!(out.lines().count(), 3, "{stop:?}: {out}");
    }

    // One output style: compact when piped, pretty on request.
    let (_, compact, _) = run_cli(&["state", "/cli/src", "--url", &s.url, "--project", "acme"]);
    assert_eq!(compact.trim().lines().count(), 1, "{compact}");
    let (_, pretty, _) = run_cli(&[
        "state",
        "/cli/src",
        "--output",
        "pretty",
        "--url",
        &s.url,
        "--project",
        "acme",
    ]);
    assert!(pretty.lines().count() > 3, "{pretty}");

    let reset = cli_json(&s, &["reset", "/cli/src"]);
    assert_eq!(reset["status"], "reset");
    let (status, _) = s.get("/v1/projects/acme/streams/cli/src:state").await;
    assert_eq!(status, 404);
    let (ok, out, err) = run_cli(&["health", "--url", &s.url]);
    assert!(ok, "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["status"], "ok");
}

#[tokio::test]
async fn components_itx_and_processor_from_the_command_line() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    for name in ["kinds", "counter"] {
        let wasm = file_in(dir.path(), &format!("{name}.wasm"));
        std::fs::write(&wasm, crate::support::guest(name)).unwrap();
        cli_json(&s, &["deploy", name, wasm.to_str().unwrap()]);
    }
    let listed = cli_json(&s, &["components"]);
    let names: Vec<&str> = listed["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["counter", "kinds"]);
    let sum = cli_json(
        &s,
        &[
            "itx",
            r#"["components", ["get", "kinds"], "add"]"#,
            "1",
            "2",
        ],
    );
    assert_eq!(sum["result"], 3);
    cli_json(&s, &["subscribe", "/cli/p", "count", "--wake", "counter"]);
    cli_json(
        &s,
        &[
            "append",
            "/cli/p",
            "--type",
            "x.y/a",
            "--payload",
            r#"{"n": 5}"#,
        ],
    );
    crate::processors::caught_up(&s, "/v1/projects/acme/streams/cli/p", "counter").await;
    let p = cli_json(&s, &["processor", "/cli/p", "counter"]);
    assert_eq!(p["state"]["sum"], 5, "{p}");
}

#[tokio::test]
async fn a_subscription_to_a_component_not_deployed_is_accepted_with_a_warning() {
    let s = Server::start_with(Some(crate::processors::PROC), &[]);
    let answer = cli_json(&s, &["subscribe", "/cli/w", "later", "--wake", "payments"]);
    let warning = answer["warnings"][0].as_str().unwrap_or_default();
    assert!(
        warning.contains("\"payments\", which is not deployed in project \"acme\""),
        "{answer}"
    );
    crate::support::wait_for(
        "the runtime to say so",
        std::time::Duration::from_secs(30),
        async || {
            let (_, rt) = s.get("/v1/projects/acme/streams/cli/w:runtime").await;
            rt["subscriptions"]["later"]["lastError"]
                .as_str()
                .is_some_and(|e| e.contains("\"payments\" is not deployed"))
        },
    )
    .await;
    // A subscription to a deployed component has no warning.
    let wasm_dir = tempfile::tempdir().unwrap();
    let wasm = file_in(wasm_dir.path(), "counter.wasm");
    std::fs::write(&wasm, crate::support::guest("counter")).unwrap();
    cli_json(&s, &["deploy", "counter", wasm.to_str().unwrap()]);
    let fine = cli_json(&s, &["subscribe", "/cli/w", "now", "--wake", "counter"]);
    assert!(fine.get("warnings").is_none(), "{fine}");

    // The warning also goes to stderr, on a line of its own.
    let (ok, out, err) = cli_with(&s, &["subscribe", "/cli/w", "again", "--wake", "payments"]);
    assert!(ok, "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("warning: ") && l.contains("\"payments\"")),
        "{err}"
    );
    assert!(
        serde_json::from_str::<Value>(&out).is_ok(),
        "stdout is the answer alone: {out}"
    );

    // A wake of a component that is not a processor is refused before
    // anything is appended, naming what it exports.
    let kinds = file_in(wasm_dir.path(), "kinds.wasm");
    std::fs::write(&kinds, crate::support::guest("kinds")).unwrap();
    cli_json(&s, &["deploy", "kinds", kinds.to_str().unwrap()]);
    let (ok, _, err) = cli_with(&s, &["subscribe", "/cli/w", "wrong", "--wake", "kinds"]);
    assert!(!ok);
    assert!(
        err.contains("component \"kinds\" is not a processor")
            && err.contains("process-event-batch"),
        "{err}"
    );
    // (The stream's other subscriptions may append their own facts
    // meanwhile; nothing names this one.)
    let events = s.all_events("/v1/projects/acme/streams/cli/w").await;
    assert!(
        !events
            .iter()
            .any(|e| e["payload"]["subscriptionKey"] == "wrong"),
        "{events:?}"
    );
}

/// Runs the CLI against `s` in project acme: (success, stdout, stderr).
#[tokio::test]
async fn a_second_server_on_a_data_dir_in_use_stops_naming_it() {
    let s = Server::start();
    let data = s.data_dir();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .output()
        .expect("running streamhost");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "data dir {} is in use by another streamhost",
            data.display()
        )),
        "{err}"
    );
    // The first one is unharmed.
    let (status, _) = s.get("/healthz").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn status_summarises_health_streams_lag_and_halts() {
    let s = Server::start_with(Some("[delivery]\nmax-attempts = 1\n"), &[]);
    cli_json(&s, &["append", "/st/a", "--type", "x.y/a"]);
    cli_json(&s, &["append", "/st/b", "--type", "x.y/a"]);
    cli_json(
        &s,
        &[
            "subscribe",
            "/st/a",
            "hook",
            "--webhook",
            "http://127.0.0.1:9/nothing-listens",
            "--start",
            "beginning",
        ],
    );
    s.wait_halted(
        "/v1/projects/acme/streams/st/a",
        "hook",
        Duration::from_secs(20),
    )
    .await;
    let status = cli_json(&s, &["status"]);
    // The server is fine; a halted subscription still needs someone, and
    // comes first.
    assert_eq!(
        status["health"], "attention: 1 halted, 0 failing",
        "{status}"
    );
    assert_eq!(status["server"], "ok", "{status}");
    let keys: Vec<&String> = status.as_object().unwrap().keys().take(3).collect();
    assert_eq!(keys, ["health", "halted", "failing"], "{status}");
    assert_eq!(status["streams"], 2, "{status}");
    assert_eq!(status["subscriptions"], 1, "{status}");
    assert_eq!(status["halted"][0]["stream"], "/st/a", "{status}");
    assert_eq!(status["halted"][0]["subscription"], "hook", "{status}");
    assert!(status["lag"].as_u64().unwrap() >= 1, "{status}");
    assert_eq!(status["mostBehind"]["subscription"], "hook", "{status}");
    let only_b = cli_json(&s, &["status", "--prefix", "/st/b"]);
    assert_eq!(only_b["streams"], 1, "{only_b}");
    assert_eq!(only_b["halted"], json!([]), "{only_b}");
    assert_eq!(only_b["health"], "ok", "{only_b}");
}

#[test]
fn completions_cover_every_command() {
    let (ok, out, err) = run_cli(&["completions", "bash"]);
    assert!(ok, "{err}");
    for command in ["ingest", "subscribe", "effects", "new", "status"] {
        assert!(out.contains(command), "bash completions miss {command}");
    }
    let (ok, out, _) = run_cli(&["completions", "zsh"]);
    assert!(ok && out.contains("#compdef streamhost"));
    let (ok, _, err) = run_cli(&["completions", "tcsh"]);
    assert!(!ok && err.contains("tcsh"), "{err}");
}

#[tokio::test]
async fn deploy_shows_its_progress_on_a_terminal_only() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter.wasm");
    std::fs::write(&counter, crate::support::guest("counter")).unwrap();
    let args = format!(
        "{BIN} deploy --url {} --project acme counter {}",
        s.url,
        counter.display()
    );
    // `script` runs the command on a pseudo-terminal.
    let out = Command::new("script")
        .args(["-qec", &args, "/dev/null"])
        .output()
        .expect("running script (util-linux)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("✓ deploying counter ("), "{text}");
    assert!(
        text.contains("the server validates it and compiles it in the background)"),
        "{text}"
    );
    // Piped, the answer alone.
    let (ok, piped, err) = run_cli(&[
        "deploy",
        "--url",
        &s.url,
        "--project",
        "acme",
        "counter",
        counter.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(!err.contains("deploying"), "{err}");
    assert!(piped.contains("sha256:"), "{piped}");
}

#[tokio::test]
async fn versions_cluster_metrics_wait_and_tables_from_the_command_line() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let wasm = file_in(dir.path(), "counter.wasm");
    std::fs::write(&wasm, crate::support::guest("counter")).unwrap();
    let deployed = cli_json(&s, &["deploy", "counter", wasm.to_str().unwrap()]);
    let versions = cli_json(&s, &["component", "versions", "counter"]);
    assert_eq!(
        versions["versions"][0]["digest"], deployed["digest"],
        "{versions}"
    );

    let cluster = run_cli(&["cluster", "--url", &s.url]);
    assert!(cluster.0, "{}", cluster.2);
    let cluster: Value = serde_json::from_str(&cluster.1).unwrap();
    assert_eq!(cluster["self"], s.url.as_str(), "{cluster}");

    cli_json(
        &s,
        &[
            "append",
            "/cli/t",
            "--type",
            "x.y/a",
            "--payload",
            r#"{"n": 7}"#,
        ],
    );
    let (ok, metrics, err) = run_cli(&["metrics", "--url", &s.url]);
    assert!(ok, "{err}");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("streamhost_append_requests_total{outcome=\"ok\"}")),
        "{metrics}"
    );

    // `wait`: the next matching event after an offset, or a timeout.
    let waited = cli_json(
        &s,
        &[
            "wait",
            "/cli/t",
            "--after-offset",
            "0",
            "--type",
            "x.y/a",
            "--where",
            "payload.n = 7",
        ],
    );
    assert_eq!(waited["event"]["payload"]["n"], 7, "{waited}");
    let (ok, _, err) = cli_with(
        &s,
        &[
            "wait",
            "/cli/t",
            "--type",
            "x.y/none",
            "--timeout-ms",
            "200",
        ],
    );
    assert!(!ok);
    assert!(err.starts_with("error: timeout: "), "{err}");

    // Tables for people: a list's items as rows under their field.
    let (ok, out, err) = cli_with(&s, &["streams", "--output", "table"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("path "))
        .expect(&out);
    assert_eq!(lines[header - 1], "streams:", "{out}");
    assert!(lines[header + 1].starts_with("/cli/t "), "{out}");
    let (ok, out, err) = cli_with(&s, &["status", "--output", "table"]);
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["health", "ok"]),
        "{out}"
    );
}
