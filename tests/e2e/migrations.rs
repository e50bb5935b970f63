//! Schema migrations: a data dir written before schema versioning (the
//! fixture `tests/fixtures/schema-v0`, made by the server at commit c36ba72
//! with a copy subscription `/orders` → `/warehouse` and the counter
//! processor on `/orders`; the component's bytes were removed to keep it
//! small) opens with every event, cursor and checkpoint, and work continues
//! from them.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{fixture, guest, skipped_on_postgres, wait_for, Server};

const CONFIG: &str =
    "[delivery]\nmax-attempts = 5\nbackoff-base-ms = 10\nbackoff-max-ms = 100\ntimeout-ms = 5000\n";

fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_data_dir_from_before_versioning_keeps_events_cursors_and_checkpoints() {
    if skipped_on_postgres("the fixture is a SQLite data dir from before schema versioning") {
        return;
    }
    let mut s = Server::start_on(Some(&fixture("schema-v0")), Some(CONFIG), &[]);
    let orders = "/v1/projects/acme/streams/orders";
    let warehouse = "/v1/projects/acme/streams/warehouse";

    // Every event.
    let events = s.all_events(orders).await;
    assert_eq!(events.len(), 8, "{events:?}");
    assert_eq!(
        events.iter().filter(|e| e["type"] == "x.y/order").count(),
        5
    );
    let (_, state) = s.get(&format!("{orders}:state")).await;
    assert_eq!(state["maxOffset"], 8);
    assert_eq!(
        state["subscriptions"]["outbound"]["byKey"]
            .as_object()
            .unwrap()
            .len(),
        2
    );
    let copied = s.all_events(warehouse).await;
    assert_eq!(copied.len(), 9);

    // The copy cursor: at 8, so nothing is copied again.
    let (_, runtime) = s.get(&format!("{orders}:runtime")).await;
    assert_eq!(
        runtime["subscriptions"]["to-warehouse"]["acknowledgedOffset"], 8,
        "{runtime}"
    );

    // The checkpoint: the counter's state through offset 8.
    let (status, p) = s.get(&format!("{orders}:processors/counter")).await;
    assert_eq!(status, 200, "{p}");
    assert_eq!(p["checkpointOffset"], 8, "{p}");
    assert_eq!(
        p["state"],
        json!({"events": 8, "sum": 15, "last_offset": 8})
    );

    // Work continues from them: a new order is copied once and folded on
    // top of the old state (the fixture has no component bytes: deploy the
    // same counter again).
    let (status, out) = s.deploy("acme", "counter", guest("counter")).await;
    assert_eq!(status, 200, "{out}");
    let (status, out) = s
        .post(
            &format!("{orders}:append"),
            json!({"events": [{"type": "x.y/order", "payload": {"n": 100}, "idempotencyKey": "order-6"}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["events"][0]["offset"], 9);
    wait_for(
        "the copy and the fold of offset 9",
        Duration::from_secs(30),
        async || {
            let (_, p) = s.get(&format!("{orders}:processors/counter")).await;
            let copied = s.all_events(warehouse).await;
            p["checkpointOffset"] == 9 && copied.len() == 10
        },
    )
    .await;
    let (_, p) = s.get(&format!("{orders}:processors/counter")).await;
    assert_eq!(
        p["state"],
        json!({"events": 9, "sum": 115, "last_offset": 9})
    );
    let copied = s.all_events(warehouse).await;
    assert_eq!(
        types(&copied).iter().filter(|t| *t == "x.y/order").count(),
        6,
        "each order copied exactly once"
    );

    // An idempotency key of the old data dir still deduplicates.
    let (status, out) = s
        .post(
            &format!("{orders}:append"),
            json!({"events": [{"type": "x.y/order", "payload": {"n": 3}, "idempotencyKey": "order-3"}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(
        out["events"][0]["offset"], 6,
        "the committed event of order-3"
    );

    // The migrated dir opens again unchanged.
    s.stop();
    s.restart();
    let events = s.all_events(orders).await;
    assert_eq!(events.len(), 9);
}
