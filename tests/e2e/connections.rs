//! Live connections over SSE and waitForEvent, with a real SSE client.

use std::time::Duration;

use serde_json::{json, Value};

use crate::subscriptions::{ev, P};
use crate::support::{assert_error, offsets, wait_for, Server, SseClient};

const S: &str = "/v1/projects/acme/streams/live";

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

async fn append(s: &Server, events: Value) -> Value {
    let (status, out) = s
        .post(&format!("{S}:append"), json!({ "events": events }))
        .await;
    assert_eq!(status, 200, "{out}");
    out
}

/// Audit events (connection-opened/closed) of the stream.
async fn audits(s: &Server) -> Vec<Value> {
    s.all_events(S)
        .await
        .into_iter()
        .filter(|e| {
            e["type"]
                .as_str()
                .unwrap()
                .starts_with("events.iterate.com/stream/connection-")
        })
        .collect()
}

#[tokio::test]
async fn replay_live_filters_and_ephemeral_compose_without_gap_or_duplicate() {
    let s = Server::start();
    append(
        &s,
        json!([
            {"type": "x.y/a", "payload": {"n": 1}},
            {"type": "x.y/b", "payload": {"n": 2}},
            {"type": "x.y/a", "payload": {"n": 3}, "ephemeral": true},
            {"type": "x.y/a", "payload": {"n": -4}},
        ]),
    )
    .await;
    let cond = enc("payload.n > 0");
    let mut c = SseClient::open(
        &s,
        &format!(
            "{S}:connect?replayAfterOffset=1&eventTypes=x.y/a&jsonataCondition={cond}&state=false"
        ),
    )
    .await
    .unwrap();
    let first = c.batch().await;
    assert_eq!(
        offsets(&first),
        vec![2, 4],
        "replay: durable and buffered ephemeral, filtered"
    );
    assert_eq!(first["events"][1]["ephemeral"], true);
    assert_eq!(first["state"], Value::Null);
    assert_eq!(first["streamMaxOffset"], 5);
    append(
        &s,
        json!([{"type": "x.y/a", "payload": {"n": 6}}, {"type": "x.y/b", "payload": {"n": 7}}]),
    )
    .await;
    append(
        &s,
        json!([{"type": "x.y/a", "payload": {"n": 8}, "ephemeral": true}]),
    )
    .await;
    // The connection's own opened event (offset 6) is filtered out by type.
    assert_eq!(c.batch_offsets().await, vec![7]);
    assert_eq!(c.batch_offsets().await, vec![9]);
}

#[tokio::test]
async fn the_first_batch_is_sent_at_once_even_empty_and_state_rides_along() {
    let s = Server::start();
    append(&s, json!([{"type": "x.y/a"}])).await;
    let mut c = SseClient::open(&s, &format!("{S}:connect")).await.unwrap();
    let first = c.batch().await;
    assert_eq!(first["events"], json!([]));
    assert_eq!(first["state"]["eventCount"], 2);
    assert_eq!(first["streamMaxOffset"], 2);
    // Live: the connection sees its own opened event, then new appends, with state.
    let opened = c.batch().await;
    assert_eq!(
        opened["events"][0]["type"],
        "events.iterate.com/stream/connection-opened"
    );
    append(&s, json!([{"type": "x.y/live"}])).await;
    let live = c.batch().await;
    assert_eq!(live["events"][0]["type"], "x.y/live");
    assert_eq!(live["state"]["maxOffset"], 4);
}

#[tokio::test]
async fn state_only_connections_coalesce_into_the_newest_state() {
    let s = Server::start();
    append(&s, json!([{"type": "x.y/a"}])).await;
    let mut c = SseClient::open(&s, &format!("{S}:connect?events=false"))
        .await
        .unwrap();
    let first = c.batch().await;
    assert_eq!(first["events"], json!([]));
    assert_eq!(first["state"]["maxOffset"], 2);
    for _ in 0..20 {
        append(&s, json!([{"type": "x.y/a"}])).await;
    }
    let mut batches = 0;
    loop {
        let b = c.batch().await;
        batches += 1;
        assert_eq!(b["events"], json!([]));
        if b["state"]["maxOffset"] == 23 {
            break;
        }
    }
    assert!(batches <= 21, "{batches} batches for 21 commits");
    assert_error(
        &s.get(&format!("{S}:connect?events=false&state=false"))
            .await,
        400,
        "invalid-request",
        "events=false with state=false",
    );
}

#[tokio::test]
async fn delivery_caps_split_a_commit_into_several_batches() {
    let s = Server::start();
    append(&s, json!([{"type": "x.y/a"}])).await;
    let mut c = SseClient::open(
        &s,
        &format!("{S}:connect?eventTypes=x.y/n&maxDeliveryEvents=2&state=false"),
    )
    .await
    .unwrap();
    assert_eq!(c.batch_offsets().await, Vec::<u64>::new());
    let five: Vec<Value> = (0..5)
        .map(|i| json!({"type": "x.y/n", "payload": {"i": i}}))
        .collect();
    append(&s, Value::Array(five)).await;
    assert_eq!(c.batch_offsets().await, vec![4, 5]);
    assert_eq!(c.batch_offsets().await, vec![6, 7]);
    assert_eq!(c.batch_offsets().await, vec![8]);

    let mut by_bytes = SseClient::open(
        &s,
        &format!("{S}:connect?eventTypes=x.y/big&maxDeliveryBytes=300&state=false"),
    )
    .await
    .unwrap();
    by_bytes.batch().await;
    let big: Vec<Value> = (0..3)
        .map(|_| json!({"type": "x.y/big", "payload": {"pad": "p".repeat(200)}}))
        .collect();
    append(&s, Value::Array(big)).await;
    for _ in 0..3 {
        assert_eq!(by_bytes.batch_offsets().await.len(), 1);
    }
}

#[tokio::test]
async fn the_same_key_replaces_the_old_connection_and_audits_both() {
    let s = Server::start();
    append(&s, json!([{"type": "x.y/a"}])).await;
    let mut old = SseClient::open(
        &s,
        &format!("{S}:connect?connectionKey=browser&eventTypes=x.y/a"),
    )
    .await
    .unwrap();
    old.batch().await;
    let mut new = SseClient::open(
        &s,
        &format!("{S}:connect?connectionKey=browser&eventTypes=x.y/a"),
    )
    .await
    .unwrap();
    new.batch().await;
    let (event, data) = old
        .next_within(Duration::from_secs(10))
        .await
        .expect("a closed message");
    assert_eq!(event, "closed");
    assert_eq!(data["reason"], "replaced");
    assert!(
        old.next_within(Duration::from_secs(5)).await.is_none(),
        "the old stream ends"
    );
    append(&s, json!([{"type": "x.y/a"}])).await;
    assert_eq!(new.batch().await["events"][0]["type"], "x.y/a");

    let (_, rt) = s.get(&format!("{S}:runtime")).await;
    assert!(rt["connections"]["browser"].is_object(), "{rt}");
    let (_, state) = s.get(&format!("{S}:state")).await;
    assert!(
        !state.to_string().contains("browser"),
        "connections never reach core state"
    );
    let a = audits(&s).await;
    let kinds: Vec<_> = a
        .iter()
        .map(|e| {
            (
                e["type"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_string(),
                e["payload"]["reason"].clone(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("connection-opened".to_string(), Value::Null),
            ("connection-closed".to_string(), json!("replaced")),
            ("connection-opened".to_string(), Value::Null),
        ]
    );
    drop(new);
    wait_for(
        "the closed-by-owner audit",
        Duration::from_secs(10),
        async || {
            audits(&s)
                .await
                .iter()
                .any(|e| e["payload"]["reason"] == "closed-by-owner")
        },
    )
    .await;
    let (_, rt) = s.get(&format!("{S}:runtime")).await;
    assert_eq!(rt["connections"], json!({}));
}

#[tokio::test]
async fn invalid_coordinates_reject_before_the_existing_connection_is_replaced() {
    let s = Server::start();
    let (_, out) = s.post(&format!("{S}:append"), ev("x.y/a", json!({}))).await;
    let stream_id = out["streamId"].as_str().unwrap().to_string();
    s.post(
        &format!("{P}/other:subscribeToEventsFrom"),
        json!({"sourceStreamPath": "/live", "subscriptionKey": "durable"}),
    )
    .await;
    let mut c = SseClient::open(
        &s,
        &format!("{S}:connect?connectionKey=k&eventTypes=x.y/a&state=false"),
    )
    .await
    .unwrap();
    c.batch().await;
    let cases: Vec<(String, u16, &str, &str)> = vec![
        (
            "replayAfterOffset=99".into(),
            400,
            "invalid-request",
            "replayAfterOffset 99 is beyond",
        ),
        (
            "replayAfterOffset=-1".into(),
            400,
            "invalid-request",
            "\"-1\"",
        ),
        (
            "replayAfterOffset=NaN".into(),
            400,
            "invalid-request",
            "\"NaN\"",
        ),
        (
            "expectedStreamId=nope".into(),
            409,
            "stream-id-changed",
            "\"nope\"",
        ),
        (
            format!("expectedStreamId={stream_id}&replayAfterOffset=0&maxReplayOffsetGap=1"),
            400,
            "invalid-request",
            "maxReplayOffsetGap 1",
        ),
        (
            format!("jsonataCondition={}", enc("payload.n >")),
            400,
            "invalid-jsonata",
            "invalid JSONata expression",
        ),
        (
            "maxDeliveryEvents=0".into(),
            400,
            "invalid-request",
            "maxDeliveryEvents",
        ),
        ("bogus=1".into(), 400, "invalid-request", "bogus"),
    ];
    for (query, status, code, mention) in cases {
        let answer = SseClient::open(&s, &format!("{S}:connect?connectionKey=k&{query}"))
            .await
            .err()
            .expect("rejected");
        assert_error(&answer, status, code, mention);
    }
    let answer = SseClient::open(&s, &format!("{S}:connect?connectionKey=durable"))
        .await
        .err()
        .expect("rejected");
    assert_error(
        &answer,
        400,
        "invalid-request",
        "already used by a durable subscription",
    );
    // A subscription may not take a live connection's key either.
    assert_error(
        &s.post(
            &format!("{P}/other:subscribeToEventsFrom"),
            json!({"sourceStreamPath": "/live", "subscriptionKey": "k"}),
        )
        .await,
        400,
        "invalid-request",
        "already used by a live session connection",
    );
    append(&s, json!([{"type": "x.y/a", "payload": {"still": true}}])).await;
    let b = c.batch().await;
    assert_eq!(
        b["events"][0]["payload"]["still"], true,
        "the existing connection still delivers"
    );
    assert_error(
        &s.get("/v1/projects/acme/streams/nowhere:connect").await,
        404,
        "stream-not-found",
        "/nowhere",
    );
}

#[tokio::test]
async fn a_live_filter_failure_closes_with_delivery_failed_and_the_error() {
    let s = Server::start();
    append(&s, json!([{"type": "x.y/n", "payload": {"n": "1"}}])).await;
    let cond = enc("$number(payload.n) > 0");
    let mut c = SseClient::open(
        &s,
        &format!("{S}:connect?connectionKey=f&eventTypes=x.y/n&jsonataCondition={cond}"),
    )
    .await
    .unwrap();
    c.batch().await;
    append(&s, json!([{"type": "x.y/n", "payload": {"n": "one"}}])).await;
    let (event, data) = c
        .next_within(Duration::from_secs(10))
        .await
        .expect("closed");
    assert_eq!(event, "closed");
    assert_eq!(data["reason"], "delivery-failed");
    assert!(
        data["error"].as_str().unwrap().contains("offset 4"),
        "{data}"
    );
    wait_for("the closed audit", Duration::from_secs(10), async || {
        audits(&s)
            .await
            .iter()
            .any(|e| e["payload"]["reason"] == "delivery-failed")
    })
    .await;
    let closed = audits(&s)
        .await
        .into_iter()
        .find(|e| e["payload"]["reason"] == "delivery-failed")
        .unwrap();
    assert_eq!(closed["payload"]["connectionKey"], "f");
    assert!(closed["payload"]["error"]
        .as_str()
        .unwrap()
        .contains("jsonataCondition failed on offset 4"));
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_without_slowing_appends_or_others() {
    let s = Server::start();
    append(&s, json!([{"type": "x.y/a"}])).await;
    let mut stalled = SseClient::open(
        &s,
        &format!("{S}:connect?connectionKey=stalled&state=false"),
    )
    .await
    .unwrap();
    stalled.batch().await; // then never read again
    let mut healthy = SseClient::open(
        &s,
        &format!("{S}:connect?connectionKey=healthy&eventTypes=x.y/big&state=false"),
    )
    .await
    .unwrap();
    healthy.batch().await;
    let pad = "p".repeat(64 * 1024);
    let mut received = 0;
    for i in 0..400 {
        append(
            &s,
            json!([{"type": "x.y/big", "payload": {"i": i, "pad": pad}}]),
        )
        .await;
        received += healthy.batch_offsets().await.len();
    }
    assert_eq!(received, 400, "the healthy client got every event");
    wait_for(
        "the stalled client to be closed",
        Duration::from_secs(20),
        async || {
            audits(&s).await.iter().any(|e| {
                e["payload"]["connectionKey"] == "stalled"
                    && e["payload"]["reason"] == "delivery-failed"
            })
        },
    )
    .await;
    let closed = audits(&s)
        .await
        .into_iter()
        .find(|e| {
            e["payload"]["connectionKey"] == "stalled"
                && e["type"].as_str().unwrap().ends_with("closed")
        })
        .unwrap();
    assert!(
        closed["payload"]["error"]
            .as_str()
            .unwrap()
            .contains("fell behind"),
        "{closed}"
    );
}

#[tokio::test]
async fn wait_for_event_in_history_in_the_ephemeral_buffer_live_and_timing_out() {
    let s = std::sync::Arc::new(Server::start());
    append(
        &s,
        json!([
            {"type": "x.y/build", "payload": {"id": 1}},
            {"type": "x.y/typing", "ephemeral": true},
        ]),
    )
    .await;
    let wait = |body: Value| {
        let s = s.clone();
        async move { s.post(&format!("{S}:waitForEvent"), body).await }
    };
    let (status, found) =
        wait(json!({"afterOffset": 0, "eventTypes": ["x.y/build"], "timeoutMs": 5000})).await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["event"]["offset"], 2);
    let (_, found) =
        wait(json!({"afterOffset": 0, "eventTypes": ["x.y/typing"], "timeoutMs": 5000})).await;
    assert_eq!(
        (
            found["event"]["offset"].clone(),
            found["event"]["ephemeral"].clone()
        ),
        (json!(3), json!(true))
    );

    let live = tokio::spawn(wait(
        json!({"jsonataCondition": "payload.id = 2", "timeoutMs": 10000}),
    ));
    wait_for(
        "the wait to be registered",
        Duration::from_secs(10),
        async || {
            let (_, rt) = s.get(&format!("{S}:runtime")).await;
            rt["connections"].as_object().is_some_and(|c| !c.is_empty())
        },
    )
    .await;
    append(&s, json!([{"type": "x.y/build", "payload": {"id": 9}}, {"type": "x.y/build", "payload": {"id": 2}}])).await;
    let (status, found) = live.await.unwrap();
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["event"]["payload"]["id"], 2);

    let (status, timeout) =
        wait(json!({"afterOffset": 0, "eventTypes": ["x.y/never"], "timeoutMs": 200})).await;
    assert_eq!(status, 408);
    assert_eq!(timeout["error"]["code"], "timeout");
    let message = timeout["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Timed out waiting for stream event after 200ms (saw "),
        "{message}"
    );
    assert!(
        message.contains("recent types: ") && message.contains("x.y/build"),
        "{message}"
    );
    // Each wait records one opened/closed pair.
    wait_for("every wait to close", Duration::from_secs(10), async || {
        let a = audits(&s).await;
        let opened = a
            .iter()
            .filter(|e| e["type"].as_str().unwrap().ends_with("opened"))
            .count();
        let closed = a
            .iter()
            .filter(|e| e["type"].as_str().unwrap().ends_with("closed"))
            .count();
        opened == 4 && closed == 4
    })
    .await;
    assert_error(
        &wait(json!({"timeoutMs": 0})).await,
        400,
        "invalid-request",
        "timeoutMs 0",
    );
}

#[tokio::test]
async fn a_restart_closes_connections_and_a_replaying_reconnect_misses_nothing() {
    let mut s = Server::start();
    append(&s, json!([{"type": "x.y/n", "payload": {"i": 0}}])).await;
    let mut c = SseClient::open(&s, &format!("{S}:connect?eventTypes=x.y/n&state=false"))
        .await
        .unwrap();
    c.batch().await;
    append(&s, json!([{"type": "x.y/n", "payload": {"i": 1}}])).await;
    let seen = c.batch_offsets().await;
    let last = *seen.last().unwrap();
    s.restart();
    assert!(
        c.next_within(Duration::from_secs(10)).await.is_none(),
        "the restart ends the stream"
    );
    for i in 2..5 {
        append(&s, json!([{"type": "x.y/n", "payload": {"i": i}}])).await;
    }
    let mut again = SseClient::open(
        &s,
        &format!("{S}:connect?eventTypes=x.y/n&state=false&replayAfterOffset={last}"),
    )
    .await
    .unwrap();
    let replayed = again.batch().await;
    let is: Vec<_> = replayed["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["payload"]["i"].as_u64().unwrap())
        .collect();
    assert_eq!(is, vec![2, 3, 4]);
}
