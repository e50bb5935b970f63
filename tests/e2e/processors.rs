//! Wasm processors end to end: real guest components built from
//! `examples/processors`, run by the real server.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{assert_error, guest, wait_for, Server};

pub const PROC: &str = r#"
[delivery]
max-attempts = 3
backoff-base-ms = 10
backoff-max-ms = 40
timeout-ms = 1000

[processors]
idle-teardown-ms = 300
"#;

const S: &str = "/v1/projects/acme/streams/orders";

fn wake(component: &str, key: &str, filter: Option<Value>) -> Value {
    let mut payload = json!({"subscriptionKey": key,
        "receiver": {"action": "processor-wake", "expression": ["components", ["get", component], "wake"]}});
    if let Some(f) = filter {
        payload["filter"] = f;
    }
    json!({"events": [{"type": "events.iterate.com/stream/subscription-configured", "payload": payload}]})
}

async fn append(s: &Server, stream: &str, events: Value) -> Value {
    let (status, out) = s
        .post(&format!("{stream}:append"), json!({ "events": events }))
        .await;
    assert_eq!(status, 200, "{out}");
    out
}

/// Waits until the processor's checkpoint reaches the stream's durable head;
/// on timeout the panic shows the processor as last read (its status and
/// last error say why it did not get there).
pub async fn caught_up(s: &Server, stream: &str, component: &str) -> Value {
    caught_up_within(s, stream, component, Duration::from_secs(30)).await
}

/// [`caught_up`] with its own deadline: a first wake that waits for a large
/// component's compile (niced, beside the rest of the suite) may need more
/// than 30 s on 2 cores.
pub async fn caught_up_within(
    s: &Server,
    stream: &str,
    component: &str,
    within: Duration,
) -> Value {
    let mut last = (json!(null), json!(null));
    let done = crate::support::poll_until(within, async || {
        let events = s.all_events(stream).await;
        let head = events
            .last()
            .map(|e| e["offset"].clone())
            .unwrap_or(json!(0));
        let (status, p) = s.get(&format!("{stream}:processors/{component}")).await;
        let done = status == 200 && p["checkpointOffset"] == head;
        last = (head, p);
        done
    })
    .await;
    assert!(
        done,
        "timed out after {within:?} waiting for {component} to catch up on {stream} (head {}): {}",
        last.0, last.1
    );
    last.1
}

/// The counter's fold of the stream's durable events, computed here.
async fn expected_count(s: &Server, stream: &str) -> Value {
    let events = s.all_events(stream).await;
    let sum: i64 = events
        .iter()
        .map(|e| e["payload"]["n"].as_i64().unwrap_or(0))
        .sum();
    json!({"events": events.len(), "sum": sum, "last_offset": events.last().unwrap()["offset"]})
}

/// A wake or a reactor of a deployed component that does not export what
/// it needs is refused at the append, over any client, naming what the
/// component exports; one not deployed yet is accepted with a warning.
#[tokio::test(flavor = "multi_thread")]
async fn a_wake_of_a_deployed_component_that_is_not_a_processor_is_refused() {
    let s = Server::start();
    let (status, out) = s.deploy("acme", "kinds", guest("kinds")).await;
    assert_eq!(status, 200, "{out}");
    assert_error(
        &s.post(&format!("{S}:append"), wake("kinds", "wrong", None))
            .await,
        400,
        "invalid-request",
        "component \"kinds\" is not a processor: it exports ",
    );
    let reactor = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "wrong.v1",
            "receiver": {"action": "reactor", "expression": ["components", ["get", "kinds"], "react"]}}}]});
    assert_error(
        &s.post(&format!("{S}:append"), reactor).await,
        400,
        "invalid-request",
        "component \"kinds\" is not a reactor: it exports ",
    );
    let (status, out) = s
        .post(&format!("{S}:append"), wake("later", "later", None))
        .await;
    assert_eq!(status, 200, "{out}");
    assert!(
        out["warnings"][0].as_str().unwrap().contains("\"later\""),
        "{out}"
    );
    let events = s.all_events(S).await;
    assert!(
        !events
            .iter()
            .any(|e| e["payload"]["subscriptionKey"] == "wrong"
                || e["payload"]["subscriptionKey"] == "wrong.v1"),
        "{events:?}"
    );
}

#[tokio::test]
async fn deploy_validates_components_and_lists_them() {
    let s = Server::start();
    let (status, out) = s.deploy("acme", "counter", guest("counter")).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["name"], "counter");
    assert!(out["digest"].as_str().unwrap().starts_with("sha256:"));
    let exports: Vec<&str> = out["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    for f in ["describe", "initial-state", "fold"] {
        assert!(exports.contains(&f), "{exports:?}");
    }
    let (_, list) = s.get("/v1/projects/acme/components").await;
    assert_eq!(list["components"][0]["name"], "counter");
    assert_eq!(list["components"][0]["digest"], out["digest"]);

    assert_error(
        &s.deploy("acme", "junk", b"not wasm at all".to_vec()).await,
        400,
        "invalid-component",
        "not a valid WebAssembly component: it is not WebAssembly (15 bytes starting 6e 6f 74",
    );
    // A core module is not a component; an rlib is what a crate without
    // crate-type = ["cdylib"] leaves. Each says how to build a component.
    for (name, bytes, what) in [
        (
            "core",
            b"\0asm\x01\0\0\0".to_vec(),
            "it is a core WebAssembly module",
        ),
        (
            "rlib",
            b"!<arch>\n/               0".to_vec(),
            "it is an rlib",
        ),
    ] {
        let answer = s.deploy("acme", name, bytes).await;
        assert_error(&answer, 400, "invalid-component", what);
        assert_error(
            &answer,
            400,
            "invalid-component",
            "cargo build --release --target wasm32-wasip2",
        );
    }
    // An empty component exports no processor interface.
    assert_error(
        &s.deploy("acme", "empty", b"\0asm\x0d\0\x01\0".to_vec())
            .await,
        400,
        "invalid-component",
        "streamhost:processor/processor@0.3.0",
    );
    assert_error(
        &s.deploy("acme", "Bad Name", guest("counter")).await,
        400,
        "invalid-request",
        "\"Bad Name\"",
    );
    let (_, list) = s.get("/v1/projects/acme/components").await;
    assert_eq!(
        list["components"].as_array().unwrap().len(),
        1,
        "nothing stored for rejected bodies"
    );
}

/// `[processors] compiled-code-bytes` bounds the compiled code held in
/// memory: with room for less than one component, only the one used last
/// stays; the other is loaded again from the compile cache when it wakes,
/// and both fold every event.
#[tokio::test]
async fn compiled_code_in_memory_stays_within_its_bound_and_an_evicted_component_loads_again() {
    let s = Server::start_with(Some(&format!("{PROC}compiled-code-bytes = 1\n")), &[]);
    for name in ["counter", "effector"] {
        let (status, out) = s.deploy("acme", name, guest(name)).await;
        assert_eq!(status, 200, "{out}");
        let (status, out) = s.post(&format!("{S}:append"), wake(name, name, None)).await;
        assert_eq!(status, 200, "{out}");
    }
    for n in 1..=3 {
        append(
            &s,
            S,
            // The effector folds this type (asking for no effects); the
            // counter folds every event.
            json!([{"type": "events.example/effects-requested", "payload": {"n": n, "effects": []}}]),
        )
        .await;
        // One wakes after the other: each wake needs its component's code.
        caught_up(&s, S, "counter").await;
        caught_up(&s, S, "effector").await;
    }
    let counter = caught_up(&s, S, "counter").await;
    assert_eq!(counter["state"], expected_count(&s, S).await, "{counter}");
    assert_eq!(counter["state"]["sum"], 6, "{counter}");
    let effector = caught_up(&s, S, "effector").await;
    assert_eq!(effector["state"]["events"], 3, "{effector}");
    assert_eq!(s.metric("streamhost_compiled_components ").await, 1);
    assert!(s.metric("streamhost_compiled_code_bytes ").await > 0);
}

#[tokio::test]
async fn the_counter_state_equals_the_fold_and_never_sees_ephemeral_events() {
    let s = Server::start_with(Some(PROC), &[]);
    s.deploy("acme", "counter", guest("counter")).await;
    append(&s, S, json!([{"type": "x.y/n", "payload": {"n": 5}}])).await;
    s.post(&format!("{S}:append"), wake("counter", "count", None))
        .await;
    append(
        &s,
        S,
        json!([
            {"type": "x.y/n", "payload": {"n": 7}},
            {"type": "x.y/n", "payload": {"n": 1000}, "ephemeral": true},
            {"type": "x.y/other", "payload": {"n": -2}},
        ]),
    )
    .await;
    let p = caught_up(&s, S, "counter").await;
    assert_eq!(p["state"], expected_count(&s, S).await);
    assert_eq!(
        p["state"]["sum"], 10,
        "the ephemeral 1000 never reached the processor"
    );
    assert_eq!(p["component"], "counter");
    let (_, list) = s.get("/v1/projects/acme/components").await;
    assert_eq!(p["digest"], list["components"][0]["digest"]);
    // Each wake is timed in /metrics (its commit included), and counted as
    // a delivery attempt of a wake receiver.
    assert!(
        s.metric("streamhost_processor_wake_duration_seconds_count")
            .await
            >= 1
    );
    assert!(
        s.metric("streamhost_delivery_attempts_total{receiver=\"wake\",outcome=\"ok\"}")
            .await
            >= 1
    );
    let (_, v) = s
        .post(
            &format!("{S}:verifyProcessor"),
            json!({"component": "counter"}),
        )
        .await;
    assert_eq!(v["matches"], true, "{v}");
    assert_eq!(v["refoldedState"], p["state"]);
    assert_error(
        &s.get(&format!("{S}:processors/nobody")).await,
        404,
        "processor-not-found",
        "\"nobody\"",
    );
}

#[tokio::test]
async fn consumes_intersects_the_stored_filter() {
    let s = Server::start_with(Some(PROC), &[]);
    s.deploy("acme", "totals", guest("order-totals")).await;
    s.post(
        &format!("{S}:append"),
        wake(
            "totals",
            "totals",
            Some(json!({"jsonataCondition": "payload.region != 'us'"})),
        ),
    )
    .await;
    append(
        &s,
        S,
        json!([
            {"type": "events.example/order-created", "payload": {"region": "eu", "total": 10}},
            {"type": "events.example/order-created", "payload": {"region": "us", "total": 99}},
            {"type": "events.example/order-shipped", "payload": {"region": "eu", "total": 1000}},
            {"type": "events.example/order-created", "payload": {"region": "eu", "total": 5}},
            {"type": "events.example/order-created", "payload": {"region": "ap", "total": 1}},
        ]),
    )
    .await;
    let p = caught_up(&s, S, "totals").await;
    assert_eq!(
        p["state"],
        json!({"regions": {"ap": {"orders": 1, "total": 1.0}, "eu": {"orders": 2, "total": 15.0}}})
    );
}

#[tokio::test]
async fn idle_processors_are_woken_again_by_the_next_append() {
    let s = Server::start_with(Some(PROC), &[]);
    s.deploy("acme", "counter", guest("counter")).await;
    s.post(&format!("{S}:append"), wake("counter", "count", None))
        .await;
    caught_up(&s, S, "counter").await;
    wait_for(
        "the processor to go idle",
        Duration::from_secs(10),
        async || s.get(&format!("{S}:processors/counter")).await.1["status"] == "idle",
    )
    .await;
    append(&s, S, json!([{"type": "x.y/n", "payload": {"n": 3}}])).await;
    let p = caught_up(&s, S, "counter").await;
    assert_eq!(p["state"]["sum"], 3);
    assert_eq!(p["status"], "active");
}

#[tokio::test]
async fn a_reset_source_starts_the_processor_from_nothing() {
    let s = Server::start_with(Some(PROC), &[]);
    s.deploy("acme", "counter", guest("counter")).await;
    s.post(&format!("{S}:append"), wake("counter", "count", None))
        .await;
    append(
        &s,
        S,
        json!([{"type": "x.y/n", "payload": {"n": 40}}, {"type": "x.y/n", "payload": {"n": 2}}]),
    )
    .await;
    let before = caught_up(&s, S, "counter").await;
    assert_eq!(before["state"]["sum"], 42);
    let (status, _) = s.post(&format!("{S}:reset"), json!({})).await;
    assert_eq!(status, 200);
    s.post(&format!("{S}:append"), wake("counter", "count", None))
        .await;
    append(&s, S, json!([{"type": "x.y/n", "payload": {"n": 1}}])).await;
    let after = caught_up(&s, S, "counter").await;
    assert_ne!(after["streamId"], before["streamId"]);
    assert_eq!(after["state"], expected_count(&s, S).await);
    assert_eq!(after["state"]["sum"], 1);
}

#[tokio::test]
async fn a_replaced_component_takes_over_at_a_checkpoint_boundary() {
    let s = Server::start_with(Some(PROC), &[]);
    let (_, v1) = s.deploy("acme", "counter", guest("counter")).await;
    s.post(&format!("{S}:append"), wake("counter", "count", None))
        .await;
    append(&s, S, json!([{"type": "x.y/n", "payload": {"n": 1}}])).await;
    let first = caught_up(&s, S, "counter").await;
    assert_eq!(first["digest"], v1["digest"]);
    let folded_before = first["state"]["events"].as_u64().unwrap();
    // The replacement keeps counting `events` but knows nothing of `sum`.
    let (_, v2) = s.deploy("acme", "counter", guest("hostile")).await;
    assert_ne!(v2["digest"], v1["digest"]);
    append(
        &s,
        S,
        json!([{"type": "x.y/n", "payload": {"n": 1}}, {"type": "x.y/n", "payload": {"n": 1}}]),
    )
    .await;
    let second = caught_up(&s, S, "counter").await;
    assert_eq!(
        second["digest"], v2["digest"],
        "the checkpoint records the digest it was made with"
    );
    assert_eq!(second["state"], json!({"events": folded_before + 2}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn state_equals_the_fold_of_the_log_across_sigkills() {
    let mut s = Server::start_with(Some(PROC), &[]);
    s.deploy("acme", "counter", guest("counter")).await;
    s.post(&format!("{S}:append"), wake("counter", "count", None))
        .await;
    let mut appended = 0;
    for round in 0..4 {
        for i in 0..50 {
            let (status, _) = s
                .post(&format!("{S}:append"), json!({"events": [{"type": "x.y/n", "payload": {"n": i}, "idempotencyKey": format!("r{round}-{i}")}]}))
                .await;
            assert_eq!(status, 200);
            appended += 1;
        }
        s.restart();
    }
    assert_eq!(appended, 200);
    let p = caught_up(&s, S, "counter").await;
    assert_eq!(
        p["state"],
        expected_count(&s, S).await,
        "no event folded twice or skipped"
    );
    let (_, v) = s
        .post(
            &format!("{S}:verifyProcessor"),
            json!({"component": "counter"}),
        )
        .await;
    assert_eq!(v["matches"], true, "{v}");
}

#[tokio::test]
async fn a_deployed_component_can_be_downloaded() {
    let s = Server::start();
    let bytes = guest("counter");
    let (status, deployed) = s.deploy("acme", "counter", bytes.clone()).await;
    assert_eq!(status, 200, "{deployed}");

    let (status, row) = s.get("/v1/projects/acme/components/counter").await;
    assert_eq!(status, 200, "{row}");
    assert_eq!(row["name"], "counter");
    assert_eq!(row["digest"], deployed["digest"]);

    let response = reqwest::Client::new()
        .get(format!("{}/v1/projects/acme/components/counter", s.url))
        .header("accept", "application/wasm")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/wasm",
        "the bytes themselves"
    );
    assert_eq!(response.bytes().await.unwrap().to_vec(), bytes);

    assert_error(
        &s.get("/v1/projects/acme/components/nope").await,
        404,
        "component-not-found",
        "\"nope\"",
    );

    // The CLI writes the same bytes to a file.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("counter.wasm");
    let (ok, printed, err) = crate::support::run_cli(&[
        "component",
        "get",
        "--url",
        &s.url,
        "--project",
        "acme",
        "counter",
        "--to",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        printed.contains(&format!("wrote {} bytes", bytes.len())),
        "{printed}"
    );
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
}

/// The compiled form of every component in the server's cache directory.
fn compiled_files(s: &Server) -> Vec<std::path::PathBuf> {
    let dir = s.data_dir().join("compiled");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        // Components, not the compiled functions they share (`functions/`).
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn a_truncated_or_flipped_compiled_component_is_compiled_again_never_loaded() {
    if crate::support::skipped_on_postgres(
        "the compile cache is files of the host's, the same on either storage",
    ) {
        return;
    }
    // Its own cache (the suite's servers share one): the data dir's.
    let mut s = Server::unstarted(None, Some(PROC), &[]);
    let own = s.data_dir().join("compiled");
    s.env.push((
        "STREAMHOST_COMPILE_CACHE_DIR".into(),
        own.display().to_string(),
    ));
    s.launch();
    s.deploy("acme", "counter", guest("counter")).await;
    s.post(&format!("{S}:append"), wake("counter", "count", None))
        .await;
    append(&s, S, json!([{"type": "x.y/n", "payload": {"n": 1}}])).await;
    caught_up(&s, S, "counter").await;
    let files = compiled_files(&s);
    assert_eq!(files.len(), 1, "one compiled component: {files:?}");
    let path = &files[0];
    let good = std::fs::read(path).unwrap();
    assert!(
        !files
            .iter()
            .any(|f| f.extension().is_some_and(|e| e == "tmp")),
        "no temporary file left: {files:?}"
    );

    let truncate = |bytes: &[u8]| bytes[..bytes.len() / 2].to_vec();
    let flip = |bytes: &[u8]| {
        let mut b = bytes.to_vec();
        let middle = b.len() / 2;
        b[middle] ^= 0x10;
        b
    };
    for (what, corrupt) in [
        ("truncated", &truncate as &dyn Fn(&[u8]) -> Vec<u8>),
        ("flipped", &flip),
    ] {
        s.stop();
        let bad = corrupt(&good);
        std::fs::write(path, &bad).unwrap();
        s.launch();
        append(&s, S, json!([{"type": "x.y/n", "payload": {"n": 2}}])).await;
        let p = caught_up(&s, S, "counter").await;
        assert_eq!(p["state"], expected_count(&s, S).await, "{what}: {p}");
        let log = s.log();
        assert!(
            log.contains("compiled component not loaded"),
            "{what}: the server says why it compiled again:\n{log}"
        );
        let now = std::fs::read(path).unwrap();
        assert_ne!(now, bad, "{what}: the cache file is rewritten");
        assert_eq!(now.len(), good.len(), "{what}: rewritten whole");
    }
}

#[tokio::test]
async fn a_wake_the_host_gave_up_on_commits_nothing_afterwards() {
    // One attempt: the first wake's timeout halts the subscription. That
    // wake is held for 1.5 s after its fold (as a slow first compile
    // would hold it), past its 300 ms deadline.
    const CONFIG: &str = "[delivery]\nmax-attempts = 1\nbackoff-base-ms = 10\nbackoff-max-ms = 40\ntimeout-ms = 300\n";
    let mut s = Server::unstarted(None, Some(CONFIG), &[]);
    s.env
        .push(("STREAMHOST_FAULTS".into(), "wake-stall-ms=1500".into()));
    s.launch();
    s.deploy("acme", "counter", guest("counter")).await;
    s.post(&format!("{S}:append"), wake("counter", "count", None))
        .await;
    append(&s, S, json!([{"type": "x.y/n", "payload": {"n": 1}}])).await;
    let halted = s.wait_halted(S, "count", Duration::from_secs(30)).await;
    assert!(
        halted["error"]
            .as_str()
            .is_some_and(|e| e.contains("timed out after 300ms")),
        "{halted}"
    );
    // Until the late wake ends: discarded, or (the defect) committed.
    wait_for(
        "the late wake to end",
        Duration::from_secs(30),
        async || {
            s.log().contains("a late wake result discarded")
                || s.get(&format!("{S}:processors/counter")).await.1["checkpointOffset"]
                    .as_u64()
                    .unwrap_or(0)
                    > 0
        },
    )
    .await;
    let (_, p) = s.get(&format!("{S}:processors/counter")).await;
    assert_eq!(p["status"], "halted", "{p}");
    assert!(
        p["checkpointOffset"].as_u64().unwrap_or(0) == 0,
        "the late fold committed nothing: {p}"
    );
    // Waiting for a halted processor answers at once, with the reason.
    let started = std::time::Instant::now();
    let (ok, _, err) = crate::support::cli_with(
        &s,
        &[
            "processor",
            "/orders",
            "counter",
            "--wait",
            "--timeout-ms",
            "30000",
        ],
    );
    assert!(!ok);
    assert!(
        err.contains("processor \"counter\" is halted at offset 0")
            && err.contains("timed out after 300ms")
            && err.contains("resume-subscription"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Resumed, the next wake folds and commits; status and checkpoint agree.
    let (status, out) = s
        .post(
            &format!("{S}:resumeSubscription"),
            json!({"subscriptionKey": "count"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let p = caught_up(&s, S, "counter").await;
    assert_eq!(p["status"], "active", "{p}");
    assert_eq!(p["state"], expected_count(&s, S).await, "{p}");
}
