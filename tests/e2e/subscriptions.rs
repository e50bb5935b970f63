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

/// Events of a stream other than its own `created` at offset 1.
pub async fn data(s: &Server, path: &str) -> Vec<Value> {
    let (status, page) = s.get(&format!("{P}{path}:events")).await;
    if status == 404 {
        return Vec::new();
    }
    let mut all = s.all_events(&format!("{P}{path}")).await;
    let _ = page;
    all.retain(|e| e["offset"] != 1);
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

#[tokio::test]
async fn generated_keys_need_an_idempotency_key_and_are_remembered() {
    let s = Server::start_with(Some(FAST), &[]);
    assert_error(
        &s.post(
            &format!("{P}/dst:subscribeToEventsFrom"),
            json!({"sourceStreamPath": "/src"}),
        )
        .await,
        400,
        "invalid-request",
        "a keyless copy subscription requires idempotencyKey so setup is safe to retry",
    );
    let first = subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "idempotencyKey": "setup-1"}),
    )
    .await;
    let offset = first["subscriptionConfiguredEvent"]["offset"]
        .as_u64()
        .unwrap();
    assert_eq!(first["subscriptionKey"], format!("subscription:{offset}"));
    assert!(
        first["subscriptionConfiguredEvent"]["payload"]
            .get("subscriptionKey")
            .is_none(),
        "the event stays keyless"
    );
    let again = subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "idempotencyKey": "setup-1"}),
    )
    .await;
    assert_eq!(
        again, first,
        "a retried setup returns the same event and key"
    );
    let other = subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "idempotencyKey": "setup-2"}),
    )
    .await;
    assert_ne!(other["subscriptionKey"], first["subscriptionKey"]);

    let (_, state) = s.get(&format!("{P}/src:state")).await;
    let key = first["subscriptionKey"].as_str().unwrap();
    assert_eq!(
        state["subscriptions"]["outbound"]["byKey"][key]["subscriptionKeyWasGenerated"],
        true
    );
    assert_eq!(
        state["subscriptions"]["outbound"]["byKey"][key]["configuration"]["subscriptionKey"],
        key
    );

    // The generated key may be passed back to replace that subscription ...
    let replaced = subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": key, "description": "moved"}),
    )
    .await;
    assert_eq!(replaced["subscriptionKey"], key);
    let (_, state) = s.get(&format!("{P}/src:state")).await;
    assert_eq!(
        state["subscriptions"]["outbound"]["byKey"][key]["subscriptionKeyWasGenerated"],
        true
    );
    // ... but a fresh caller may not claim the reserved prefix.
    assert_error(
        &s.post(
            &format!("{P}/dst:subscribeToEventsFrom"),
            json!({"sourceStreamPath": "/src", "subscriptionKey": "subscription:999"}),
        )
        .await,
        400,
        "invalid-request",
        "\"subscription:999\"",
    );
}

#[tokio::test]
async fn repeated_subscribe_reuses_the_original_now_cursor() {
    let s = Server::start_with(Some(FAST), &[]);
    let body = json!({"sourceStreamPath": "/src", "subscriptionKey": "k", "start": "now"});
    let first = subscribe(&s, "/dst", body.clone()).await;
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({"n": 1})))
        .await;
    wait_count(&s, "/dst", 1).await;
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({"n": 2})))
        .await;
    let again = subscribe(&s, "/dst", body).await;
    assert_eq!(
        again["subscriptionConfiguredEvent"],
        first["subscriptionConfiguredEvent"]
    );
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({"n": 3})))
        .await;
    let copies = wait_count(&s, "/dst", 3).await;
    let ns: Vec<_> = copies.iter().map(|c| c["payload"]["n"].clone()).collect();
    assert_eq!(
        ns,
        vec![json!(1), json!(2), json!(3)],
        "no event lost or repeated"
    );
}

#[tokio::test]
async fn replace_and_cursor_set_start_new_runs_that_copy_again() {
    let s = Server::start_with(Some(FAST), &[]);
    for n in 1..=2 {
        s.post(&format!("{P}/src:append"), ev("x.y/a", json!({"n": n})))
            .await;
    }
    let first = subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k", "start": "beginning"}),
    )
    .await;
    let gen1 = first["subscriptionConfiguredEvent"]["offset"]
        .as_u64()
        .unwrap();
    // From the beginning: created, the two events and the configure event itself.
    let copies = wait_count(&s, "/dst", 4).await;
    assert!(copies
        .iter()
        .all(|c| c["source"]["copiedFrom"][0]["cursorChangedAtSourceOffset"] == gen1));
    assert_eq!(copies[0]["type"], "events.iterate.com/stream/created");

    // Replace with a filter: a new run from the beginning copies again.
    let second = subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k", "start": "beginning",
               "filter": {"eventTypes": ["x.y/a"]}}),
    )
    .await;
    let gen2 = second["subscriptionConfiguredEvent"]["offset"]
        .as_u64()
        .unwrap();
    assert!(gen2 > gen1);
    let copies = wait_count(&s, "/dst", 6).await;
    let run2: Vec<_> = copies[4..]
        .iter()
        .map(|c| {
            (
                c["payload"]["n"].clone(),
                c["source"]["copiedFrom"][0]["cursorChangedAtSourceOffset"].clone(),
            )
        })
        .collect();
    assert_eq!(run2, vec![(json!(1), json!(gen2)), (json!(2), json!(gen2))]);

    // Cursor-set copies the same source offset again.
    let (status, out) = s
        .post(
            &format!("{P}/src:setSubscriptionCursor"),
            json!({"subscriptionKey": "k", "afterOffset": 2}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let gen3 = out["subscriptionCursorSetEvent"]["offset"]
        .as_u64()
        .unwrap();
    let copies = wait_count(&s, "/dst", 7).await;
    assert_eq!(copies[6]["payload"]["n"], 2);
    assert_eq!(copies[6]["source"]["copiedFrom"][0]["offset"], 3);
    assert_eq!(
        copies[6]["source"]["copiedFrom"][0]["cursorChangedAtSourceOffset"],
        gen3
    );
    let (_, state) = s.get(&format!("{P}/src:state")).await;
    assert_eq!(
        state["subscriptions"]["outbound"]["byKey"]["k"]["cursorSet"],
        json!({"afterOffset": 2, "setAtSourceOffset": gen3})
    );
    let (_, dst) = s.get(&format!("{P}/dst:state")).await;
    assert_eq!(
        dst["subscriptions"]["inbound"]["bySourcePath"]["/src"]["k"]["cursorChangedAtSourceOffset"],
        gen3
    );
}

#[tokio::test]
async fn filter_and_transform_shape_the_copies() {
    let s = Server::start_with(Some(FAST), &[]);
    subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "eu",
               "filter": {"eventTypes": ["x.y/order"], "jsonataCondition": "payload.region = 'eu'"},
               "jsonataTransform": "{\"type\": \"x.y/eu-order\", \"payload\": {\"total\": payload.total * 2}}"}),
    )
    .await;
    s.post(
        &format!("{P}/src:append"),
        json!({"events": [
            {"type": "x.y/order", "payload": {"region": "us", "total": 1}},
            {"type": "x.y/other", "payload": {"region": "eu", "total": 2}},
            {"type": "x.y/order", "payload": {"region": "eu", "total": 3}, "metadata": {"m": 1}},
            {"type": "x.y/order", "payload": {"region": "eu", "total": 4}, "ephemeral": true},
            {"type": "x.y/order", "payload": {"region": "eu", "total": 5}},
        ]}),
    )
    .await;
    let copies = wait_count(&s, "/dst", 2).await;
    assert_eq!(copies[0]["type"], "x.y/eu-order");
    assert_eq!(copies[0]["payload"], json!({"total": 6}));
    assert_eq!(
        copies[0]["metadata"],
        json!({"m": 1}),
        "omitted fields copy verbatim"
    );
    assert_eq!(
        copies[0]["source"]["copiedFrom"][0]["type"], "x.y/order",
        "provenance keeps the source type"
    );
    assert_eq!(
        copies[1]["payload"],
        json!({"total": 10}),
        "ephemeral events are never delivered"
    );
    // Non-matching events still advance the cursor.
    wait_for(
        "the cursor to pass every event",
        Duration::from_secs(10),
        async || {
            let (_, rt) = s.get(&format!("{P}/src:runtime")).await;
            rt["subscriptions"]["eu"]["acknowledgedOffset"] == 7
        },
    )
    .await;
}

#[tokio::test]
async fn a_failing_receiver_halts_with_a_durable_fact_and_resume_delivers_the_held_event() {
    let mut s = Server::start_with(Some(FAST), &[]);
    s.post(
        &format!("{P}/dst:append"),
        ev(
            "events.iterate.com/stream/paused",
            json!({"reason": "closed"}),
        ),
    )
    .await;
    subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k"}),
    )
    .await;
    s.post(&format!("{P}/src:append"), ev("x.y/held", json!({})))
        .await;
    let halted = &s
        .wait_halted(&format!("{P}/src"), "k", Duration::from_secs(20))
        .await;
    assert_eq!(halted["reason"], "delivery-failed");
    assert_eq!(halted["attempts"], 3);
    assert_eq!(halted["afterOffset"], 2);
    assert!(
        halted["error"]
            .as_str()
            .unwrap()
            .contains("stream paused: closed"),
        "{halted}"
    );
    let events = s.all_events(&format!("{P}/src")).await;
    let fact = events.last().unwrap();
    assert_eq!(
        fact["type"],
        "events.iterate.com/stream/subscription-delivery-halted"
    );
    assert_eq!(fact["payload"]["subscriptionKey"], "k");

    // The halt is durable: it survives a restart, and nothing is retried.
    s.restart();
    let (_, rt) = s.get(&format!("{P}/src:runtime")).await;
    assert_eq!(rt["subscriptions"]["k"]["halted"], true);
    assert_eq!(rt["subscriptions"]["k"]["acknowledgedOffset"], 2);

    s.post(
        &format!("{P}/dst:append"),
        ev("events.iterate.com/stream/resumed", json!({})),
    )
    .await;
    let (status, out) = s
        .post(
            &format!("{P}/src:resumeSubscription"),
            json!({"subscriptionKey": "k"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(
        out["subscriptionDeliveryResumedEvent"]["type"],
        "events.iterate.com/stream/subscription-delivery-resumed"
    );
    let copies = wait_for_type(&s, "/dst", "x.y/held").await;
    assert_eq!(copies.len(), 1);
    let (_, st) = s.get(&format!("{P}/src:state")).await;
    assert!(st["subscriptions"]["outbound"]["byKey"]["k"]
        .get("deliveryHalted")
        .is_none());
}

/// Waits for a copy of type `t` on `path` and returns all such copies.
pub async fn wait_for_type(s: &Server, path: &str, t: &str) -> Vec<Value> {
    wait_for(
        &format!("a {t} on {path}"),
        Duration::from_secs(20),
        async || data(s, path).await.iter().any(|e| e["type"] == t),
    )
    .await;
    data(s, path)
        .await
        .into_iter()
        .filter(|e| e["type"] == t)
        .collect()
}

#[tokio::test]
async fn a_throwing_filter_halts_and_never_advances_past_later_events() {
    let s = Server::start_with(Some(FAST), &[]);
    subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k",
               "filter": {"eventTypes": ["x.y/n"], "jsonataCondition": "$number(payload.n) > 0"}}),
    )
    .await;
    s.post(
        &format!("{P}/src:append"),
        json!({"events": [
            {"type": "x.y/n", "payload": {"n": "1"}},
            {"type": "x.y/n", "payload": {"n": "one"}},
            {"type": "x.y/n", "payload": {"n": "2"}},
        ]}),
    )
    .await;
    let halted = &s
        .wait_halted(&format!("{P}/src"), "k", Duration::from_secs(20))
        .await;
    assert!(
        halted["error"]
            .as_str()
            .unwrap()
            .starts_with("subscription \"k\" filter condition failed on offset 4:"),
        "{halted}"
    );
    assert_eq!(halted["afterOffset"], 3);
    let copies = data(&s, "/dst").await;
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0]["payload"]["n"], "1");
}

#[tokio::test]
async fn unsubscribe_removes_then_answers_already_absent() {
    let s = Server::start_with(Some(FAST), &[]);
    subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k"}),
    )
    .await;
    let body = json!({"sourceStreamPath": "/src", "subscriptionKey": "k"});
    let (status, out) = s
        .post(&format!("{P}/dst:unsubscribeFromEvents"), body.clone())
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["status"], "removed");
    assert_eq!(
        out["subscriptionRemovedEvent"]["payload"],
        json!({"subscriptionKey": "k", "reason": "requested"})
    );
    assert_eq!(
        s.post(&format!("{P}/dst:unsubscribeFromEvents"), body)
            .await,
        (200, json!({"status": "already-absent"}))
    );
    let (_, st) = s.get(&format!("{P}/src:state")).await;
    assert_eq!(st["subscriptions"]["outbound"]["byKey"], json!({}));
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({})))
        .await;
    let (_, rt) = s.get(&format!("{P}/src:runtime")).await;
    assert_eq!(rt["subscriptions"], json!({}));
    assert_eq!(
        s.post(
            &format!("{P}/dst:unsubscribeFromEvents"),
            json!({"sourceStreamPath": "/never", "subscriptionKey": "k"})
        )
        .await,
        (200, json!({"status": "already-absent"}))
    );
}

#[tokio::test]
async fn set_cursor_and_resume_in_one_call() {
    let s = Server::start_with(Some(FAST), &[]);
    subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k"}),
    )
    .await;
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({})))
        .await;
    wait_count(&s, "/dst", 1).await;
    let (status, out) = s
        .post(
            &format!("{P}/src:setSubscriptionCursorAndResume"),
            json!({"subscriptionKey": "k", "afterOffset": 0}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(
        out["cursorSet"]["type"],
        "events.iterate.com/stream/subscription-cursor-set"
    );
    assert_eq!(
        out["resumed"]["type"],
        "events.iterate.com/stream/subscription-delivery-resumed"
    );
    // From offset 0: created, configured, the event, and the two new control events.
    wait_count(&s, "/dst", 1 + 5).await;
}

#[tokio::test]
async fn at_most_64_subscriptions_per_source_and_receiver() {
    let s = Server::start_with(Some(FAST), &[]);
    let configs: Vec<Value> = (0..64)
        .map(|i| {
            json!({"type": "events.iterate.com/stream/subscription-configured",
            "payload": {"subscriptionKey": format!("k{i}"), "filter": {"eventTypes": ["never"]},
                "receiver": {"action": "copy-to-stream", "receivingStreamPath": "/dst",
                             "delivery": {"start": "now", "onFailingEvent": "halt"}}}})
        })
        .collect();
    let (status, out) = s
        .post(&format!("{P}/src:append"), json!({"events": configs}))
        .await;
    assert_eq!(status, 200, "{out}");
    assert_error(
        &s.post(
            &format!("{P}/dst:subscribeToEventsFrom"),
            json!({"sourceStreamPath": "/src", "subscriptionKey": "k64"}),
        )
        .await,
        400,
        "invalid-request",
        "at most 64 subscriptions for one receiving stream",
    );
    // Replacing one of the 64 is fine; another receiver is fine.
    subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k0"}),
    )
    .await;
    subscribe(
        &s,
        "/dst2",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k64"}),
    )
    .await;
}
