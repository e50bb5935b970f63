//! Durable subscriptions and copy-to-stream, end to end.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{assert_error, wait_for, Server};

/// Fast delivery timing for tests.
pub const FAST: &str = r#"
[delivery]
max-attempts = 3
backoff-base-ms = 10
backoff-max-ms = 40
timeout-ms = 5000
"#;

pub const P: &str = "/v1/projects/acme/streams";

pub fn ev(t: &str, payload: Value) -> Value {
    json!({"events": [{"type": t, "payload": payload}]})
}

/// Events of a stream other than `created`.
pub async fn data(s: &Server, path: &str) -> Vec<Value> {
    let (status, page) = s.get(&format!("{P}{path}:events")).await;
    if status == 404 {
        return Vec::new();
    }
    let mut all = s.all_events(&format!("{P}{path}")).await;
    let _ = page;
    all.retain(|e| e["type"] != "events.iterate.com/stream/created");
    all
}

/// Waits until `path` holds `n` events besides `created`.
pub async fn wait_count(s: &Server, path: &str, n: usize) -> Vec<Value> {
    wait_for(
        &format!("{n} events on {path}"),
        Duration::from_secs(20),
        async || data(s, path).await.len() >= n,
    )
    .await;
    let events = data(s, path).await;
    assert_eq!(events.len(), n, "{path}: {events:#?}");
    events
}

pub async fn subscribe(s: &Server, receiver: &str, body: Value) -> Value {
    let (status, out) = s
        .post(&format!("{P}{receiver}:subscribeToEventsFrom"), body)
        .await;
    assert_eq!(status, 200, "{out}");
    out
}

#[tokio::test]
async fn configure_commits_on_the_source_alone_and_the_receiver_learns_on_first_copy() {
    let s = Server::start_with(Some(FAST), &[]);
    s.post(&format!("{P}/src:append"), ev("x.y/before", json!({})))
        .await;
    let out = subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k"}),
    )
    .await;
    assert_eq!(out["subscriptionKey"], "k");
    let configured = &out["subscriptionConfiguredEvent"];
    assert_eq!(
        configured["type"],
        "events.iterate.com/stream/subscription-configured"
    );
    assert_eq!(configured["offset"], 3);
    assert_eq!(
        configured["payload"]["receiver"],
        json!({"action": "copy-to-stream", "receivingStreamPath": "/dst",
               "delivery": {"start": "now", "onFailingEvent": "halt"}})
    );
    // Nothing on the receiver yet: no handshake.
    assert_error(
        &s.get(&format!("{P}/dst:state")).await,
        404,
        "stream-not-found",
        "/dst",
    );
    let (_, state) = s.get(&format!("{P}/src:state")).await;
    let sub = &state["subscriptions"]["outbound"]["byKey"]["k"];
    assert_eq!(sub["configuredAtOffset"], 3);
    assert_eq!(sub["configuration"]["subscriptionKey"], "k");
    assert!(sub.get("subscriptionKeyWasGenerated").is_none());

    let (_, appended) = s
        .post(&format!("{P}/src:append"), ev("x.y/after", json!({"n": 1})))
        .await;
    let copies = wait_count(&s, "/dst", 1).await;
    let copy = &copies[0];
    assert_eq!(copy["type"], "x.y/after");
    assert_eq!(copy["payload"], json!({"n": 1}));
    let hop = &copy["source"]["copiedFrom"][0];
    let (_, src_state) = s.get(&format!("{P}/src:state")).await;
    assert_eq!(
        *hop,
        json!({"projectId": "acme", "path": "/src", "streamId": src_state["streamId"],
               "streamCreatedAt": src_state["createdAt"], "offset": 4, "type": "x.y/after",
               "createdAt": appended["events"][0]["createdAt"], "subscriptionKey": "k",
               "cursorChangedAtSourceOffset": 3})
    );
    let (_, dst) = s.get(&format!("{P}/dst:state")).await;
    let record = &dst["subscriptions"]["inbound"]["bySourcePath"]["/src"]["k"];
    assert_eq!(record["streamId"], src_state["streamId"]);
    assert_eq!(record["cursorChangedAtSourceOffset"], 3);
    assert_eq!(record["numEventsReceived"], 1);
    assert_eq!(record["lastEventReceivedAt"], copy["createdAt"]);

    wait_for(
        "the cursor to reach the head",
        Duration::from_secs(10),
        async || {
            let (_, rt) = s.get(&format!("{P}/src:runtime")).await;
            rt["subscriptions"]["k"]["acknowledgedOffset"] == 4
        },
    )
    .await;
    let (_, rt) = s.get(&format!("{P}/src:runtime")).await;
    let k = &rt["subscriptions"]["k"];
    assert_eq!(
        (
            k["lag"].clone(),
            k["attempt"].clone(),
            k["lastError"].clone()
        ),
        (json!(0), json!(0), Value::Null)
    );
    assert_eq!(k["completionLatencyMs"]["count"], 1);
}
