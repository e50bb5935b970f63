//! Redaction (`:redact`): one event's payload and metadata erased from
//! storage (the database itself, not only the API), its offset, type and
//! idempotency key kept, an audit line beside it, processors not refolded
//! (a verify names what it met), copies untouched until redacted on their
//! own stream, and what it refuses.

use std::time::Duration;

use serde_json::{json, Value};

use crate::processors::{caught_up, PROC};
use crate::support::{assert_error, guest, postgres_base, wait_for, Server};

const USERS: &str = "/v1/projects/acme/streams/users";
const COPIES: &str = "/v1/projects/acme/streams/users-copy";
/// What must leave storage.
const SECRET: &str = "ada-lovelace-4111-1111-1111";

async fn append(s: &Server, stream: &str, events: Value) -> Vec<Value> {
    let (status, out) = s
        .post(&format!("{stream}:append"), json!({ "events": events }))
        .await;
    assert_eq!(status, 200, "{out}");
    out["events"].as_array().unwrap().clone()
}

/// Redacts `offset` of `stream` ("erasure request"); the answer.
async fn redacted(s: &Server, stream: &str, offset: &Value) -> Value {
    let (status, out) = s
        .post(
            &format!("{stream}:redact"),
            json!({"offset": offset, "reason": "erasure request"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    out
}

async fn event_at(s: &Server, stream: &str, offset: u64) -> Value {
    let (status, page) = s
        .get(&format!(
            "{stream}:events?afterOffset={}&limit=1",
            offset - 1
        ))
        .await;
    assert_eq!(status, 200, "{page}");
    page["events"][0].clone()
}

#[tokio::test]
async fn a_redacted_events_content_leaves_storage_and_its_offset_key_and_neighbours_stay() {
    let mut s = Server::start_with(Some(PROC), &[]);
    let (status, out) = s.deploy("acme", "counter", guest("counter")).await;
    assert_eq!(status, 200, "{out}");
    let wake = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "counter",
            "receiver": {"action": "processor-wake", "expression": ["components", ["get", "counter"], "wake"]}}});
    let copy = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "copy", "filter": {"eventTypes": ["events.example/signed-up"]},
            "receiver": {"action": "copy-to-stream", "receivingStreamPath": "/users-copy",
                "delivery": {"start": "beginning", "onFailingEvent": "halt"}}}});
    append(&s, USERS, json!([wake, copy])).await;
    let appended = append(
        &s,
        USERS,
        json!([
            {"type": "events.example/signed-up", "payload": {"n": 1}, "idempotencyKey": "u-1"},
            {"type": "events.example/signed-up", "payload": {"n": 5, "card": SECRET},
                "metadata": {"ip": SECRET}, "idempotencyKey": "u-2"},
            {"type": "events.example/signed-up", "payload": {"n": 2}, "idempotencyKey": "u-3"},
        ]),
    )
    .await;
    let offset = appended[1]["offset"].as_u64().unwrap();
    let before = caught_up(&s, USERS, "counter").await;
    assert_eq!(before["state"]["sum"], 8, "{before}");
    wait_for("three copies", Duration::from_secs(20), async || {
        s.get(&format!("{COPIES}:events?limit=10")).await.1["events"]
            .as_array()
            .is_some_and(|e| e.len() >= 4)
    })
    .await;
    let all_before: Vec<u64> = s
        .all_events(USERS)
        .await
        .iter()
        .map(|e| e["offset"].as_u64().unwrap())
        .collect();

    let out = redacted(&s, USERS, &json!(offset)).await;
    let event = &out["event"];
    assert_eq!(event["offset"], offset);
    assert_eq!(event["type"], "events.example/signed-up");
    assert_eq!(event["idempotencyKey"], "u-2");
    assert_eq!(event["payload"], Value::Null, "{out}");
    assert_eq!(event["metadata"], Value::Null, "{out}");
    assert_eq!(event["redacted"]["reason"], "erasure request");
    assert!(event["redacted"]["at"].as_str().unwrap().starts_with("20"));
    let line = &out["redactedEvent"];
    assert_eq!(line["type"], "events.iterate.com/stream/event-redacted");
    assert_eq!(
        line["payload"],
        json!({"offset": offset, "reason": "erasure request"})
    );
    assert!(!out.to_string().contains(SECRET));

    // Read back as stored; nothing moved.
    assert_eq!(event_at(&s, USERS, offset).await, *event);
    let all_after: Vec<Value> = s.all_events(USERS).await;
    let offsets: Vec<u64> = all_after
        .iter()
        .map(|e| e["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets[..all_before.len()], all_before[..]);
    assert_eq!(offsets.len(), all_before.len() + 1, "the audit line");
    assert_eq!(
        event_at(&s, USERS, offset + 1).await["payload"],
        json!({"n": 2})
    );
    // A retry of its key still deduplicates: answered with the event as it
    // is now, nothing appended.
    let retried = append(
        &s,
        USERS,
        json!([{"type": "events.example/signed-up", "payload": {"n": 5, "card": SECRET},
            "metadata": {"ip": SECRET}, "idempotencyKey": "u-2"}]),
    )
    .await;
    assert_eq!(retried[0], *event);
    assert_eq!(s.all_events(USERS).await.len(), all_after.len());

    // The processor is not refolded; a verify names the redaction it met.
    let now = caught_up(&s, USERS, "counter").await;
    assert_eq!(now["state"]["sum"], 8, "{now}");
    let (status, v) = s
        .post(
            &format!("{USERS}:verifyProcessor"),
            json!({"component": "counter"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["redactedOffsets"], json!([offset]), "{v}");
    assert_eq!(
        v["refoldedState"]["sum"], 3,
        "the refold saw a null payload: {v}"
    );
    assert_eq!(v["matches"], false, "{v}");

    // Its copy keeps its content until redacted on its own stream.
    let copies = s.all_events(COPIES).await;
    let copied = copies
        .iter()
        .find(|e| e["payload"]["card"] == SECRET)
        .expect("the copy of the redacted event")
        .clone();
    let out = redacted(&s, COPIES, &copied["offset"]).await;
    assert_eq!(out["event"]["payload"], Value::Null);
    assert!(out["event"]["source"]["copiedFrom"].is_array(), "{out}");

    // A copy made after the redaction is redacted too.
    let late = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "late", "filter": {"eventTypes": ["events.example/signed-up"]},
            "receiver": {"action": "copy-to-stream", "receivingStreamPath": "/users-late",
                "delivery": {"start": "beginning", "onFailingEvent": "halt"}}}});
    append(&s, USERS, json!([late])).await;
    let late_stream = "/v1/projects/acme/streams/users-late";
    wait_for("three late copies", Duration::from_secs(20), async || {
        s.get(&format!("{late_stream}:events?limit=10")).await.1["events"]
            .as_array()
            .is_some_and(|e| e.len() >= 4)
    })
    .await;
    let late_copies = s.all_events(late_stream).await;
    let late_copy = late_copies
        .iter()
        .find(|e| e["source"]["copiedFrom"][0]["offset"] == offset)
        .expect("the late copy of the redacted event");
    assert_eq!(late_copy["payload"], Value::Null, "{late_copy}");
    assert_eq!(late_copy["metadata"], Value::Null, "{late_copy}");
    assert_eq!(late_copy["redacted"]["reason"], "erasure request");
    // A caller cannot forge a redaction mark.
    let (status, out) = s
        .post(
            &format!("{USERS}:append"),
            json!({"events": [{"type": "events.example/signed-up",
                "redacted": {"at": "2026-01-01T00:00:00.000Z", "reason": "forged"}}]}),
        )
        .await;
    assert_eq!(status, 403, "{out}");

    // Gone from the database's live rows, not only from the API (the
    // files themselves: the test below).
    let left = s.db().query_i64(&format!(
        "SELECT COUNT(*) FROM events WHERE body LIKE '%{SECRET}%'"
    ));
    assert_eq!(left, Some(0));
    if postgres_base().is_none() {
        s.stop();
    }
}

#[tokio::test]
async fn redaction_refuses_what_it_cannot_do_naming_the_offset() {
    let s = Server::start();
    let appended = append(
        &s,
        USERS,
        json!([{"type": "events.example/signed-up", "payload": {"n": 1}},
               {"type": "events.example/noted", "payload": {"n": 2}, "ephemeral": true}]),
    )
    .await;
    let (data, ephemeral) = (
        appended[0]["offset"].as_u64().unwrap(),
        appended[1]["offset"].as_u64().unwrap(),
    );
    let redact = async |offset: Value, reason: Value| {
        s.post(
            &format!("{USERS}:redact"),
            json!({"offset": offset, "reason": reason}),
        )
        .await
    };
    assert_error(
        &redact(json!(999), json!("r")).await,
        404,
        "event-not-found",
        "offset 999",
    );
    assert_error(
        &redact(json!(0), json!("r")).await,
        404,
        "event-not-found",
        "offset 0",
    );
    assert_error(
        &redact(json!(ephemeral), json!("r")).await,
        404,
        "event-not-found",
        "ephemeral",
    );
    assert_error(
        &redact(json!(1), json!("r")).await,
        409,
        "not-redactable",
        "events.iterate.com/stream/created",
    );
    assert_error(
        &redact(json!(data), json!("x".repeat(2000))).await,
        400,
        "invalid-request",
        "2000 bytes",
    );
    assert_error(
        &redact(json!(-1), json!("r")).await,
        400,
        "invalid-request",
        "offset",
    );
    let (status, _) = redact(json!(data), json!("first")).await;
    assert_eq!(status, 200);
    assert_error(
        &redact(json!(data), json!("second")).await,
        409,
        "already-redacted",
        &format!("offset {data}"),
    );
    // One redaction, one audit line.
    let lines = s
        .all_events(USERS)
        .await
        .into_iter()
        .filter(|e| e["type"] == "events.iterate.com/stream/event-redacted")
        .count();
    assert_eq!(lines, 1);
    // The audit line is the platform's: a caller cannot append one.
    let (status, out) = s
        .post(
            &format!("{USERS}:append"),
            json!({"events": [{"type": "events.iterate.com/stream/event-redacted",
                "payload": {"offset": data, "reason": "forged"}}]}),
        )
        .await;
    assert_eq!(status, 403, "{out}");
    // A stream that does not exist is not created by asking.
    assert_error(
        &s.post(
            "/v1/projects/acme/streams/nobody:redact",
            json!({"offset": 2, "reason": "r"}),
        )
        .await,
        404,
        "stream-not-found",
        "/nobody",
    );
    assert_eq!(s.get("/v1/projects/acme/streams/nobody:state").await.0, 404);
}

#[tokio::test]
async fn the_erased_bytes_leave_the_database_files() {
    if crate::support::skipped_on_postgres("the check reads SQLite's files") {
        return;
    }
    let mut s = Server::start();
    let appended = append(
        &s,
        USERS,
        json!([{"type": "events.example/signed-up", "payload": {"card": SECRET}},
               {"type": "events.example/signed-up", "payload": {"n": 2}}]),
    )
    .await;
    let offset = appended[0]["offset"].as_u64().unwrap();
    let holding = |s: &Server| -> Vec<String> {
        std::fs::read_dir(s.data_dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .filter(|p| {
                let bytes = std::fs::read(p).unwrap();
                bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes())
            })
            .map(|p| p.display().to_string())
            .collect()
    };
    assert!(!holding(&s).is_empty(), "written to the log first");
    let out = redacted(&s, USERS, &json!(offset)).await;
    assert_eq!(out["event"]["payload"], Value::Null);
    // (Without freed content zeroed, the old cell stays in its page: the
    // database file holds the bytes after the checkpoint and the stop.)
    s.stop();
    assert_eq!(holding(&s), Vec::<String>::new());
}
