//! Deterministic folds: a processor that reads its WASI clock and random
//! bytes (`examples/processors/clocky`) folds to the same state whatever
//! batches the wakes happened to fold, so `:verifyProcessor`, a refold and
//! `streamhost fold` all reproduce what the wakes computed.

use serde_json::{json, Value};

use crate::processors::caught_up;
use crate::support::{file_in, guest, run_cli, Server};

const S: &str = "/v1/projects/acme/streams/clocky";

async fn append(s: &Server, n: usize) {
    let events: Vec<Value> = (0..n)
        .map(|i| json!({"type": "x.y/tick", "payload": {"i": i}}))
        .collect();
    let (status, out) = s
        .post(&format!("{S}:append"), json!({ "events": events }))
        .await;
    assert_eq!(status, 200, "{out}");
}

#[tokio::test]
async fn a_guest_reading_clock_and_random_verifies_after_wakes_of_mixed_batches_and_a_kill() {
    let mut s = Server::start_with(Some(crate::processors::PROC), &[]);
    let (status, out) = s.deploy("acme", "clocky", guest("clocky")).await;
    assert_eq!(status, 200, "{out}");
    let (status, out) = s
        .post(
            &format!("{S}:append"),
            json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": "c", "receiver": {"action": "processor-wake",
                    "expression": ["components", ["get", "clocky"], "wake"]}}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    // Wakes of one, five, one and three events.
    for n in [1, 5, 1, 3] {
        append(&s, n).await;
        caught_up(&s, S, "clocky").await;
    }
    s.restart();
    append(&s, 4).await;
    let p = caught_up(&s, S, "clocky").await;
    let state = &p["state"];
    assert!(
        state["clock"].as_u64().unwrap() > 0,
        "it read its clock: {p}"
    );
    assert!(
        state["rand"].as_u64().unwrap() > 0,
        "it read random bytes: {p}"
    );
    assert_eq!(state["maxCounter"], 1, "a fresh instance per call: {p}");

    let (status, verified) = s
        .post(
            &format!("{S}:verifyProcessor"),
            json!({"component": "clocky"}),
        )
        .await;
    assert_eq!(status, 200, "{verified}");
    assert_eq!(verified["matches"], true, "{verified}");

    // Offline, from the stream's events and its stream id: the same state.
    let events = s.all_events(S).await;
    let dir = tempfile::tempdir().unwrap();
    let lines: String = events.iter().map(|e| format!("{e}\n")).collect();
    let file = file_in(dir.path(), "events.jsonl");
    std::fs::write(&file, lines).unwrap();
    let wasm = file_in(dir.path(), "clocky.wasm");
    std::fs::write(&wasm, guest("clocky")).unwrap();
    let stream_id = p["streamId"].as_str().unwrap();
    let (ok, out, err) = run_cli(&[
        "fold",
        wasm.to_str().unwrap(),
        "--events",
        file.to_str().unwrap(),
        "--stream-id",
        stream_id,
    ]);
    assert!(ok, "{err}");
    let offline: Value = serde_json::from_str(&out).expect(&out);
    assert_eq!(&offline, state);
}

#[test]
fn a_failing_fold_states_its_environment_and_the_offline_fold_replays_it() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = file_in(dir.path(), "hostile.wasm");
    std::fs::write(&hostile, guest("hostile")).unwrap();
    let bad = file_in(dir.path(), "bad.jsonl");
    std::fs::write(
        &bad,
        "{\"type\": \"hostile/clock-trap\", \"offset\": 7, \"createdAt\": \"2026-11-30T01:02:03.004Z\"}\n",
    )
    .unwrap();
    let (ok, _, err) = run_cli(&[
        "fold",
        hostile.to_str().unwrap(),
        "--events",
        bad.to_str().unwrap(),
    ]);
    assert!(!ok);
    let clock = "--clock-ms 1796000523004";
    assert!(
        err.contains(clock),
        "the clock is the event's createdAt: {err}"
    );
    let seed = err
        .split("--seed ")
        .nth(1)
        .and_then(|rest| rest.get(..64))
        .expect("a seed")
        .to_string();
    let (ok, _, again) = run_cli(&[
        "fold",
        hostile.to_str().unwrap(),
        "--events",
        bad.to_str().unwrap(),
        "--clock-ms",
        "1796000523004",
        "--seed",
        &seed,
    ]);
    assert!(!ok);
    assert!(again.contains("the guest trapped"), "{again}");
    // The replay ran with the stated clock: the guest's message shows it.
    assert!(again.contains("1796000523"), "{again}");
    // A call that read neither its clock nor random bytes says nothing of
    // them: its failure does not depend on them.
    let plain = file_in(dir.path(), "plain.jsonl");
    std::fs::write(&plain, "{\"type\": \"hostile/trap\"}\n").unwrap();
    let (ok, _, err) = run_cli(&[
        "fold",
        hostile.to_str().unwrap(),
        "--events",
        plain.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("traps on purpose"), "{err}");
    assert!(
        !err.contains("--clock-ms") && !err.contains("seed"),
        "{err}"
    );
    let (ok, _, refused) = run_cli(&[
        "fold",
        hostile.to_str().unwrap(),
        "--events",
        bad.to_str().unwrap(),
        "--seed",
        "abc",
    ]);
    assert!(!ok);
    assert!(
        refused.contains("\"abc\" is not 64 hexadecimal digits"),
        "{refused}"
    );
}

/// Whether folding a batch of 50 events with `guest` read the clock or
/// random bytes (the witness that sends a batch to be folded per event).
fn reads_its_environment(guest_name: &str) -> bool {
    use streamhost::processor::runtime::{Batch, Determinism, Runtime, StreamInfo};
    let cache = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(cache.path().to_path_buf()).unwrap();
    let bytes = guest(guest_name);
    let digest = streamhost::processor::runtime::digest(&bytes);
    let prepared = runtime.prepare(&digest, || Ok(bytes.clone())).unwrap();
    let initial = runtime
        .initial_state(guest_name, &prepared, 20_000)
        .unwrap();
    let batch = Batch {
        stream: StreamInfo {
            project_id: Some("acme".into()),
            path: "/s".into(),
            stream_id: "sid".into(),
            stream_created_at: "2026-11-30T00:00:00.000Z".into(),
            max_offset: 51,
        },
        events: json!((0..50)
            .map(|i| json!({
                "offset": i + 2,
                "type": "x.y/n",
                "payload": {"n": i},
                "createdAt": "2026-11-30T00:00:00.000Z",
            }))
            .collect::<Vec<_>>())
        .to_string(),
        scanned_through_offset: 51,
    };
    let env = Determinism::for_event("sid", 2, 0);
    let witness = env.witness.clone();
    runtime
        .fold(
            guest_name,
            &prepared,
            &initial,
            &batch,
            env,
            20_000,
            streamhost::processor::keyed::Bucket::empty().session(),
            None,
        )
        .0
        .expect("fold");
    witness.read()
}

#[test]
fn only_a_guest_that_reads_clock_or_random_is_folded_one_event_per_call() {
    assert!(
        !reads_its_environment("counter"),
        "the SDK and std read neither on their own, so a pure guest keeps its batches"
    );
    assert!(reads_its_environment("clocky"));
}
