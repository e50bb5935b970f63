//! The stream rules of API.md: creation, offsets, batches, idempotency,
//! compare-and-append, ephemeral events, pause, reset, state, restart.

use serde_json::{json, Value};

use crate::support::{assert_error, Server};

const S: &str = "/v1/projects/acme/streams/orders/eu";

fn one(event_type: &str, payload: Value) -> Value {
    json!({"events": [{"type": event_type, "payload": payload}]})
}

#[tokio::test]
async fn first_append_creates_the_stream_with_a_created_event_at_offset_1() {
    let s = Server::start();
    assert_error(
        &s.get(&format!("{S}:events")).await,
        404,
        "stream-not-found",
        "/orders/eu",
    );
    assert_error(
        &s.get(&format!("{S}:state")).await,
        404,
        "stream-not-found",
        "/orders/eu",
    );

    let (status, body) = s
        .post(
            &format!("{S}:append"),
            one("events.example/order-created", json!({"total": 120})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let stream_id = body["streamId"].as_str().unwrap().to_string();
    assert!(body["streamCreatedAt"].as_str().unwrap().ends_with('Z'));
    let e = &body["events"][0];
    assert_eq!(e["offset"], 2);
    assert_eq!(e["payload"], json!({"total": 120}));
    assert!(
        e.get("metadata").is_none()
            && e.get("idempotencyKey").is_none()
            && e.get("source").is_none()
    );
    let created_at = e["createdAt"].as_str().unwrap();
    assert_eq!(
        created_at.len(),
        "2026-11-30T04:39:01.123Z".len(),
        "{created_at}"
    );

    let events = s.all_events(S).await;
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["offset"], 1);
    assert_eq!(events[0]["type"], "events.iterate.com/stream/created");
    assert_eq!(
        events[0]["payload"],
        json!({"projectId": "acme", "path": "/orders/eu", "streamId": stream_id})
    );

    // Payload defaults to {}.
    let (_, body) = s
        .post(
            &format!("{S}:append"),
            json!({"events": [{"type": "x.y/z"}]}),
        )
        .await;
    assert_eq!(body["events"][0]["payload"], json!({}));
}

#[tokio::test]
async fn offsets_are_dense_and_a_batch_commits_all_or_nothing() {
    let s = Server::start();
    let batch: Vec<Value> = (0..5)
        .map(|i| json!({"type": "x.y/n", "payload": {"i": i}}))
        .collect();
    let (status, body) = s
        .post(&format!("{S}:append"), json!({"events": batch}))
        .await;
    assert_eq!(status, 200, "{body}");
    let offsets: Vec<u64> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, vec![2, 3, 4, 5, 6]);

    // The third event fails compare-and-append: nothing of the batch commits.
    let bad = json!({"events": [
        {"type": "x.y/n"}, {"type": "x.y/n"}, {"type": "x.y/n", "offset": 99}
    ]});
    assert_error(
        &s.post(&format!("{S}:append"), bad).await,
        409,
        "offset-conflict",
        "expected next offset 99, found 9",
    );
    let (_, page) = s.get(&format!("{S}:events")).await;
    assert_eq!(page["maxOffset"], 6);
    assert_eq!(s.all_events(S).await.len(), 6);

    // Pages: afterOffset is exclusive, limit bounds the page.
    let (_, page) = s.get(&format!("{S}:events?afterOffset=2&limit=2")).await;
    let offsets: Vec<u64> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, vec![3, 4]);
    let (_, next) = s
        .post(&format!("{S}:append"), one("x.y/n", json!({})))
        .await;
    assert_eq!(next["events"][0]["offset"], 7);
}

#[tokio::test]
async fn idempotency_keys_replay_the_original_or_conflict() {
    let s = Server::start();
    let ev = json!({"events": [{"type": "x.y/order", "payload": {"n": 1}, "metadata": {"c": "1"}, "idempotencyKey": "order-7"}]});
    let (_, first) = s.post(&format!("{S}:append"), ev.clone()).await;
    let (status, again) = s.post(&format!("{S}:append"), ev).await;
    assert_eq!(status, 200);
    assert_eq!(
        again["events"][0], first["events"][0],
        "replay returns the original event"
    );
    assert_eq!(s.all_events(S).await.len(), 2, "replay commits nothing");

    for different in [
        json!({"type": "x.y/order", "payload": {"n": 2}, "metadata": {"c": "1"}, "idempotencyKey": "order-7"}),
        json!({"type": "x.y/other", "payload": {"n": 1}, "metadata": {"c": "1"}, "idempotencyKey": "order-7"}),
        json!({"type": "x.y/order", "payload": {"n": 1}, "idempotencyKey": "order-7"}),
    ] {
        let answer = s
            .post(&format!("{S}:append"), json!({"events": [different]}))
            .await;
        assert_error(&answer, 409, "idempotency-conflict", "\"order-7\"");
        assert!(answer.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("offset 2"));
    }

    // A batch whose keys are looked up in more than one statement.
    let batch = json!({"events": (0..250).map(|i| json!({"type": "x.y/b", "payload": {"i": i}, "idempotencyKey": format!("batch-{i}")})).collect::<Vec<_>>()});
    let (status, batch_first) = s.post(&format!("{S}:append"), batch.clone()).await;
    assert_eq!(status, 200, "{batch_first}");
    let committed = s.all_events(S).await.len();

    // Keys survive a restart (they are looked up in the log).
    let mut s = s;
    s.restart();
    let (_, after_restart) = s
        .post(&format!("{S}:append"), json!({"events": [{"type": "x.y/order", "payload": {"n": 1}, "metadata": {"c": "1"}, "idempotencyKey": "order-7"}]}))
        .await;
    assert_eq!(after_restart["events"][0], first["events"][0]);
    // The whole batch retried: every event its original, nothing committed.
    let (status, batch_again) = s.post(&format!("{S}:append"), batch).await;
    assert_eq!(status, 200, "{batch_again}");
    assert_eq!(batch_again["events"], batch_first["events"]);
    assert_eq!(s.all_events(S).await.len(), committed);

    // A key repeated inside one batch returns the batch's own event.
    let (status, body) = s
        .post(&format!("{S}:append"), json!({"events": [
            {"type": "x.y/a", "idempotencyKey": "dup"}, {"type": "x.y/a", "idempotencyKey": "dup"}
        ]}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["events"][0], body["events"][1]);
}

/// Keys are checked by the log's own insert, not read first: a round that
/// repeats a key the host no longer remembers (after a restart, or an event
/// too large to keep) is refused by the log's index and planned again, and
/// the requests it held that were new still commit, densely, once.
#[tokio::test]
async fn keys_the_host_no_longer_remembers_are_checked_by_the_log() {
    let s = Server::start();
    let big = "x".repeat(5000);
    let keyed = |k: &str, n: u64| json!({"events": [{"type": "x.y/k", "payload": {"n": n}, "idempotencyKey": k}]});
    let (_, large) = s
        .post(&format!("{S}:append"), json!({"events": [{"type": "x.y/big", "payload": {"b": big}, "idempotencyKey": "large"}]}))
        .await;
    let (status, again) = s
        .post(&format!("{S}:append"), json!({"events": [{"type": "x.y/big", "payload": {"b": big}, "idempotencyKey": "large"}]}))
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["events"][0], large["events"][0]);
    let conflict = s
        .post(&format!("{S}:append"), json!({"events": [{"type": "x.y/big", "payload": {"b": "other"}, "idempotencyKey": "large"}]}))
        .await;
    assert_error(&conflict, 409, "idempotency-conflict", "\"large\"");

    let mut originals = Vec::new();
    for i in 0..16u64 {
        let (_, body) = s
            .post(&format!("{S}:append"), keyed(&format!("k{i}"), i))
            .await;
        originals.push(body["events"][0].clone());
    }
    // A compare-and-append, whose retry (the same key, the same expected
    // offset) must replay it, not meet its own offset as a conflict.
    let cas = |offset: usize| json!({"events": [{"type": "x.y/k", "idempotencyKey": "cas", "offset": offset}]});
    let next = s.all_events(S).await.len() + 1;
    let (status, cas_first) = s.post(&format!("{S}:append"), cas(next)).await;
    assert_eq!(status, 200, "{cas_first}");
    let before = s.all_events(S).await.len();
    let mut s = s;
    s.restart();
    let (status, cas_again) = s.post(&format!("{S}:append"), cas(next)).await;
    assert_eq!(
        status, 200,
        "a retried compare-and-append replays: {cas_again}"
    );
    assert_eq!(cas_again["events"][0], cas_first["events"][0]);
    assert_error(
        &s.post(
            &format!("{S}:append"),
            json!({"events": [{"type": "x.y/k", "offset": next}]}),
        )
        .await,
        409,
        "offset-conflict",
        &format!("expected next offset {next}"),
    );
    // Old keys (replays) and new keys at once, so that rounds mix them.
    let answers = futures_util::future::join_all((0..32u64).map(|i| {
        let s = &s;
        async move {
            let key = if i % 2 == 0 {
                format!("k{}", i / 2)
            } else {
                format!("new{i}")
            };
            let n = if i % 2 == 0 { i / 2 } else { i };
            s.post(&format!("{S}:append"), keyed(&key, n)).await
        }
    }))
    .await;
    let mut new_offsets = Vec::new();
    for (i, (status, body)) in answers.iter().enumerate() {
        assert_eq!(*status, 200, "request {i}: {body}");
        if i % 2 == 0 {
            assert_eq!(
                body["events"][0],
                originals[i / 2],
                "request {i} replays the original"
            );
        } else {
            new_offsets.push(body["events"][0]["offset"].as_u64().unwrap());
        }
    }
    new_offsets.sort_unstable();
    let first = before as u64 + 1;
    assert_eq!(
        new_offsets,
        (first..first + 16).collect::<Vec<_>>(),
        "new keys commit once, densely"
    );
    assert_eq!(
        s.all_events(S).await.len(),
        before + 16,
        "replays commit nothing"
    );
}

#[tokio::test]
async fn compare_and_append_and_expected_stream_id() {
    let s = Server::start();
    let (_, body) = s
        .post(
            &format!("{S}:append"),
            json!({"events": [{"type": "x.y/a", "offset": 2}]}),
        )
        .await;
    assert_eq!(body["events"][0]["offset"], 2);
    let stream_id = body["streamId"].as_str().unwrap().to_string();
    assert_error(
        &s.post(
            &format!("{S}:append"),
            json!({"events": [{"type": "x.y/a", "offset": 2}]}),
        )
        .await,
        409,
        "offset-conflict",
        "expected next offset 2, found 3",
    );
    let (status, _) = s
        .post(
            &format!("{S}:append"),
            json!({"events": [{"type": "x.y/a"}], "expectedStreamId": stream_id}),
        )
        .await;
    assert_eq!(status, 200);
    assert_error(
        &s.post(
            &format!("{S}:append"),
            json!({"events": [{"type": "x.y/a"}], "expectedStreamId": "nope"}),
        )
        .await,
        409,
        "stream-id-changed",
        "\"nope\"",
    );
}

#[tokio::test]
async fn ephemeral_events_take_offsets_but_stay_out_of_reads_and_are_never_reused() {
    let mut s = Server::start();
    let (_, body) = s
        .post(&format!("{S}:append"), json!({"events": [
            {"type": "x.y/durable"}, {"type": "x.y/typing", "ephemeral": true}, {"type": "x.y/durable"}
        ]}))
        .await;
    assert_eq!(body["events"][1]["ephemeral"], true);
    assert_eq!(body["events"][1]["offset"], 3);
    assert!(body["events"][0].get("ephemeral").is_none());

    let offsets = |page: &Value| -> Vec<u64> {
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["offset"].as_u64().unwrap())
            .collect()
    };
    let (_, page) = s.get(&format!("{S}:events")).await;
    assert_eq!(offsets(&page), vec![1, 2, 4]);
    let (_, page) = s.get(&format!("{S}:events?includeEphemeral=true")).await;
    assert_eq!(offsets(&page), vec![1, 2, 3, 4]);
    assert_eq!(page["events"][2]["type"], "x.y/typing");
    // The append answered each event as reads serve it (the stored ones
    // from the text it stored, the ephemeral one serialized).
    assert_eq!(
        body["events"].as_array().unwrap()[..],
        page["events"].as_array().unwrap()[1..]
    );

    // An ephemeral event at the head: its offset is not reused after a crash.
    let (_, body) = s
        .post(
            &format!("{S}:append"),
            json!({"events": [{"type": "x.y/typing", "ephemeral": true}]}),
        )
        .await;
    assert_eq!(body["events"][0]["offset"], 5);
    let (_, state) = s.get(&format!("{S}:state")).await;
    assert_eq!(
        (state["maxOffset"].as_u64(), state["eventCount"].as_u64()),
        (Some(5), Some(3))
    );
    s.restart();
    let (_, page) = s.get(&format!("{S}:events?includeEphemeral=true")).await;
    assert_eq!(
        offsets(&page),
        vec![1, 2, 4],
        "the buffer is gone with the process"
    );
    assert_eq!(page["maxOffset"], 5);
    let (_, body) = s
        .post(&format!("{S}:append"), one("x.y/durable", json!({})))
        .await;
    assert_eq!(body["events"][0]["offset"], 6);

    assert_error(
        &s.post(
            &format!("{S}:append"),
            json!({"events": [{"type": "x.y/a", "ephemeral": true, "idempotencyKey": "k"}]}),
        )
        .await,
        400,
        "invalid-request",
        "idempotencyKey",
    );
    assert_error(
        &s.post(
            &format!("{S}:append"),
            json!({"events": [{"type": "events.iterate.com/stream/paused", "ephemeral": true}]}),
        )
        .await,
        400,
        "invalid-request",
        "events.iterate.com/stream/paused",
    );
}

#[tokio::test]
async fn platform_authored_types_and_provenance_are_refused() {
    let s = Server::start();
    for t in [
        "events.iterate.com/stream/created",
        "events.iterate.com/stream/subscription-delivery-halted",
        "events.iterate.com/stream/connection-opened",
        "events.iterate.com/stream/connection-closed",
    ] {
        assert_error(
            &s.post(&format!("{S}:append"), one(t, json!({}))).await,
            403,
            "platform-authored",
            t,
        );
    }
    let hop = json!({"projectId": "acme", "path": "/src", "streamId": "x", "streamCreatedAt": "2026-11-30T00:00:00.000Z",
        "offset": 2, "type": "x.y/a", "createdAt": "2026-11-30T00:00:00.000Z", "subscriptionKey": "k",
        "cursorChangedAtSourceOffset": 1});
    assert_error(
        &s.post(
            &format!("{S}:append"),
            json!({"events": [{"type": "x.y/a", "source": {"copiedFrom": [hop]}}]}),
        )
        .await,
        403,
        "platform-authored",
        "source.copiedFrom",
    );
    assert_error(
        &s.get(&format!("{S}:state")).await,
        404,
        "stream-not-found",
        "/orders/eu",
    );
}

#[tokio::test]
async fn a_paused_stream_refuses_data_until_resumed() {
    let s = Server::start();
    s.post(
        &format!("{S}:append"),
        one(
            "events.iterate.com/stream/paused",
            json!({"reason": "migrating"}),
        ),
    )
    .await;
    let (_, state) = s.get(&format!("{S}:state")).await;
    assert_eq!(
        (state["paused"].clone(), state["pauseReason"].clone()),
        (json!(true), json!("migrating"))
    );

    let response = reqwest::Client::new()
        .post(format!("{}{S}:append", s.url))
        .json(&one("x.y/a", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.headers().get("retry-after").is_some());
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "stream-paused");
    assert_eq!(body["error"]["message"], "stream paused: migrating");
    let hint = body["error"]["hint"].as_str().unwrap_or_default();
    assert!(
        hint.contains("append events.iterate.com/stream/resumed to resume it"),
        "{body}"
    );

    let (status, _) = s
        .post(
            &format!("{S}:append"),
            one("events.iterate.com/stream/resumed", json!({})),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = s
        .post(&format!("{S}:append"), one("x.y/a", json!({})))
        .await;
    assert_eq!(status, 200);
    let (_, state) = s.get(&format!("{S}:state")).await;
    assert_eq!(
        (state["paused"].clone(), state["pauseReason"].clone()),
        (json!(false), Value::Null)
    );
}

#[tokio::test]
async fn state_has_the_seed_shape_and_survives_restart() {
    let mut s = Server::start();
    s.post(&format!("{S}:append"), one("x.y/a", json!({})))
        .await;
    s.post(
        &format!("{S}:append"),
        one("events.iterate.com/stream/paused", json!({"reason": "r"})),
    )
    .await;
    let (_, state) = s.get(&format!("{S}:state")).await;
    assert_eq!(state["projectId"], "acme");
    assert_eq!(state["path"], "/orders/eu");
    assert_eq!(state["eventCount"], 3);
    assert_eq!(state["maxOffset"], 3);
    assert_eq!(
        state["subscriptions"],
        json!({"inbound": {"bySourcePath": {}}, "outbound": {"byKey": {}}})
    );
    let created = s.all_events(S).await[0].clone();
    assert_eq!(state["streamId"], created["payload"]["streamId"]);
    assert_eq!(state["createdAt"], created["createdAt"]);

    s.restart();
    let (_, reloaded) = s.get(&format!("{S}:state")).await;
    assert_eq!(reloaded, state);
    let (_, runtime) = s.get(&format!("{S}:runtime")).await;
    assert_eq!(runtime, json!({"subscriptions": {}, "connections": {}}));
    assert_error(
        &s.get("/v1/projects/acme/streams/nope:runtime").await,
        404,
        "stream-not-found",
        "/nope",
    );
}

#[tokio::test]
async fn a_state_cache_that_disagrees_with_the_log_is_rebuilt_from_the_log() {
    let mut s = Server::start();
    s.post(
        &format!("{S}:append"),
        one("events.iterate.com/stream/paused", json!({"reason": "r"})),
    )
    .await;
    let (_, state) = s.get(&format!("{S}:state")).await;
    s.kill();
    // Corrupt the cached snapshot: the host must notice it no longer matches
    // the log's head and fold the log again.
    s.db()
        .execute("UPDATE streams SET state_json = '{}', state_offset = 1");
    s.restart();
    let (_, reloaded) = s.get(&format!("{S}:state")).await;
    assert_eq!(reloaded, state);
}

#[tokio::test]
async fn reset_starts_a_new_lifetime() {
    let mut s = Server::start_with(Some(crate::support::TOKENS), &[]);
    s.token = Some("t-acme".into());
    let (_, first) = s
        .post(&format!("{S}:append"), one("x.y/a", json!({})))
        .await;
    assert_error(
        &s.post(&format!("{S}:reset"), json!({})).await,
        403,
        "forbidden",
        "admin",
    );

    s.token = Some("t-admin".into());
    let (status, body) = s.post(&format!("{S}:reset"), json!({})).await;
    assert_eq!((status, body), (200, json!({"status": "reset"})));
    assert_error(
        &s.get(&format!("{S}:events")).await,
        404,
        "stream-not-found",
        "/orders/eu",
    );

    let (_, again) = s
        .post(&format!("{S}:append"), one("x.y/a", json!({})))
        .await;
    assert_eq!(
        again["events"][0]["offset"], 2,
        "offsets start from 1 again"
    );
    assert_ne!(
        again["streamId"], first["streamId"],
        "a new lifetime has a new streamId"
    );
    s.restart();
    let events = s.all_events(S).await;
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["payload"]["streamId"], again["streamId"]);
}

#[tokio::test]
async fn paths_are_canonicalized_and_namespaces_are_separate() {
    let s = Server::start();
    let (status, _) = s
        .post(
            "/v1/projects/acme/streams/a/./b/../c:append",
            one("x.y/a", json!({})),
        )
        .await;
    assert_eq!(status, 200);
    let events = s.all_events("/v1/projects/acme/streams/a/c").await;
    assert_eq!(events[0]["payload"]["path"], "/a/c");
    let (status, _) = s
        .post(
            "/v1/projects/acme/streams//a//c/:append",
            one("x.y/a", json!({})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(s.all_events("/v1/projects/acme/streams/a/c").await.len(), 3);

    // The root stream, another project, and the global namespace are distinct.
    s.post(
        "/v1/projects/acme/streams/:append",
        one("x.y/root", json!({})),
    )
    .await;
    let root = s.all_events("/v1/projects/acme/streams/").await;
    assert_eq!(root[0]["payload"]["path"], "/");
    s.post(
        "/v1/projects/other/streams/a/c:append",
        one("x.y/a", json!({})),
    )
    .await;
    assert_eq!(
        s.all_events("/v1/projects/other/streams/a/c").await.len(),
        2
    );
    s.post("/v1/global/streams/a/c:append", one("x.y/a", json!({})))
        .await;
    let (_, state) = s.get("/v1/global/streams/a/c:state").await;
    assert_eq!(state["projectId"], Value::Null);
    assert_eq!(state["eventCount"], 2);
}

#[tokio::test]
async fn limits_on_bodies_and_on_the_core_state() {
    let s = Server::start_with(Some("max-body-bytes = 4096"), &[]);
    let big = "x".repeat(5000);
    assert_error(
        &s.post(&format!("{S}:append"), one("x.y/a", json!({"big": big})))
            .await,
        413,
        "too-large",
        "4096",
    );
    assert_error(
        &s.get(&format!("{S}:state")).await,
        404,
        "stream-not-found",
        "/orders/eu",
    );

    let s = Server::start();
    let reason = "r".repeat(1024 * 1024);
    assert_error(
        &s.post(
            &format!("{S}:append"),
            one(
                "events.iterate.com/stream/paused",
                json!({"reason": reason}),
            ),
        )
        .await,
        413,
        "too-large",
        "core state",
    );
    assert_error(
        &s.get(&format!("{S}:state")).await,
        404,
        "stream-not-found",
        "/orders/eu",
    );
}

#[tokio::test]
async fn health_and_metrics() {
    let s = Server::start();
    assert_eq!(s.get("/healthz").await, (200, json!({"status": "ok"})));
    s.post(&format!("{S}:append"), one("x.y/a", json!({})))
        .await;
    let text = reqwest::get(format!("{}/metrics", s.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "streamhost_append_requests_total{outcome=\"ok\"} 1",
        "streamhost_events_committed_total 2",
        "streamhost_commit_duration_seconds_count",
        "streamhost_commit_group_writes_bucket",
        "streamhost_commit_group_events_sum",
    ] {
        assert!(text.contains(name), "metrics lack {name:?}:\n{text}");
    }
}

#[tokio::test]
async fn streams_list_in_path_order_with_prefix_and_pages() {
    let mut s = Server::start_with(Some(crate::support::TOKENS), &[]);
    s.token = Some("t-acme".into());
    for path in ["/orders/us", "/orders/eu", "/other", "/orders/eu/returns"] {
        let (status, out) = s
            .post(
                &format!("/v1/projects/acme/streams{path}:append"),
                json!({"events": [{"type": "x.y/a"}]}),
            )
            .await;
        assert_eq!(status, 200, "{out}");
    }
    s.post(
        "/v1/projects/acme/streams/orders/eu:append",
        json!({"events": [{"type": "events.iterate.com/stream/paused", "payload": {"reason": "audit"}}]}),
    )
    .await;
    let (status, page) = s
        .get("/v1/projects/acme/streams?prefix=/orders&limit=2")
        .await;
    assert_eq!(status, 200, "{page}");
    let paths: Vec<&str> = page["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, vec!["/orders/eu", "/orders/eu/returns"]);
    assert_eq!(page["nextAfterPath"], "/orders/eu/returns");
    let eu = &page["streams"][0];
    let (_, state) = s.get("/v1/projects/acme/streams/orders/eu:state").await;
    assert_eq!(eu["streamId"], state["streamId"]);
    assert_eq!(eu["createdAt"], state["createdAt"]);
    assert_eq!(eu["maxOffset"], 3);
    assert_eq!(eu["eventCount"], 3);
    assert_eq!(eu["paused"], true);
    assert_eq!(eu["subscriptions"], 0);
    let (_, rest) = s
        .get("/v1/projects/acme/streams?prefix=/orders&limit=2&afterPath=/orders/eu/returns")
        .await;
    assert_eq!(rest["streams"].as_array().unwrap().len(), 1);
    assert_eq!(rest["streams"][0]["path"], "/orders/us");
    assert_eq!(rest["nextAfterPath"], Value::Null);
    let (_, all) = s.get("/v1/projects/acme/streams").await;
    assert_eq!(all["streams"].as_array().unwrap().len(), 4);

    assert_error(
        &s.get("/v1/projects/acme/streams?limit=0").await,
        400,
        "invalid-request",
        "limit \"0\"",
    );
    assert_error(
        &s.get("/v1/projects/other/streams").await,
        403,
        "forbidden",
        "other",
    );
    assert_error(
        &s.get("/v1/global/streams").await,
        403,
        "forbidden",
        "admin",
    );
    s.token = Some("t-admin".into());
    let (status, global) = s.get("/v1/global/streams").await;
    assert_eq!(status, 200, "{global}");
    assert_eq!(global["streams"], json!([]));

    // The CLI lists the same page.
    let (ok, out, err) = crate::support::run_cli(&[
        "streams",
        "--url",
        &s.url,
        "--token",
        "t-acme",
        "--project",
        "acme",
        "--prefix",
        "/orders",
        "--limit",
        "2",
    ]);
    assert!(ok, "{err}");
    let cli: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(cli["nextAfterPath"], "/orders/eu/returns");
}

/// Bytes of the events of a page but its last: under the bound, however
/// large the last one.
fn bytes_before_last(events: &[Value]) -> usize {
    let n = events.len().saturating_sub(1);
    events[..n].iter().map(|e| e.to_string().len()).sum()
}

#[tokio::test]
async fn pages_replays_and_copies_are_bounded_in_bytes_and_lose_nothing() {
    const BOUND: usize = 100_000;
    let config = format!(
        "{}\n[limits]\nmax-read-bytes = {BOUND}\n",
        crate::subscriptions::FAST
    );
    let s = Server::start_with(Some(&config), &[]);
    let (p, src) = (crate::subscriptions::P, "/big");
    // A copy of everything, subscribed before the events (from its start).
    crate::subscriptions::subscribe(
        &s,
        "/copy",
        json!({"sourceStreamPath": src, "subscriptionKey": "k"}),
    )
    .await;
    let pad = "x".repeat(40_000);
    for n in 0..20 {
        // One event alone is over the bound: it is read, alone or last.
        let pad = if n == 10 {
            "y".repeat(3 * BOUND / 2)
        } else {
            pad.clone()
        };
        let (status, out) = s
            .post(
                &format!("{p}{src}:append"),
                one("x.y/big", json!({"n": n, "pad": pad})),
            )
            .await;
        assert_eq!(status, 200, "{out}");
    }
    // Twice: the first pages come from the database, the second from the
    // tail of recent events that a read starts keeping.
    for round in 0..2 {
        let (mut after, mut offsets, mut pages) = (0u64, Vec::new(), 0);
        loop {
            let (status, page) = s
                .get(&format!("{p}{src}:events?afterOffset={after}&limit=500"))
                .await;
            assert_eq!(status, 200, "{page}");
            let events = page["events"].as_array().unwrap();
            let Some(last) = events.last() else { break };
            assert!(
                bytes_before_last(events) < BOUND,
                "round {round}, page after {after}"
            );
            pages += 1;
            after = last["offset"].as_u64().unwrap();
            offsets.extend(events.iter().map(|e| e["offset"].as_u64().unwrap()));
        }
        // `created`, the subscription's configure event, the 20.
        assert_eq!(offsets, (1..=22).collect::<Vec<_>>(), "round {round}");
        // 910 KB in pages that stop at the first event reaching 100 KB.
        assert!(
            pages >= 6,
            "20 events of 40 KB and more, 100 KB pages: {pages} pages"
        );
    }
    // The copy's scans too: every event, once, in order.
    let copied = crate::subscriptions::wait_count(&s, "/copy", 20).await;
    let ns: Vec<u64> = copied
        .iter()
        .map(|e| e["payload"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, (0..20).collect::<Vec<_>>());
    // A live connection's replay reads pages of the same bound, in order.
    let mut sse = crate::support::SseClient::open(
        &s,
        &format!("{p}{src}:connect?replayAfterOffset=0&state=false"),
    )
    .await
    .expect("a connection");
    let mut replayed = Vec::new();
    while replayed.last() != Some(&22) {
        replayed.extend(sse.batch_offsets().await);
    }
    assert_eq!(replayed, (1..=22).collect::<Vec<_>>());
}

/// A 3 MB event (written in parts on SQLite) reads back whole from the
/// tail cache and, after a SIGKILL, from storage; a retry with its key is
/// answered with the original (its body compared from storage), another
/// body with the key is refused; a small append to another stream meanwhile
/// is unaffected.
#[tokio::test]
async fn a_large_event_reads_back_whole_after_a_kill_and_its_key_still_deduplicates() {
    let mut s = Server::start_with(None, &[]);
    let big = "é".repeat(1_500_000);
    let event = json!({"type": "x.y/big", "payload": {"blob": big}, "idempotencyKey": "big-1"});
    let (status, first) = s
        .post(
            "/v1/projects/acme/streams/large:append",
            json!({"events": [event]}),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    let offset = first["events"][0]["offset"].as_u64().unwrap();
    let read = |events: Vec<Value>| {
        events
            .into_iter()
            .find(|e| e["offset"] == offset)
            .expect("the large event")
    };
    let cached = read(s.all_events("/v1/projects/acme/streams/large").await);
    assert!(cached["payload"]["blob"] == big.as_str(), "the cached read");
    if crate::support::postgres_base().is_none() {
        let parts = s.db().query_i64("SELECT count(*) FROM event_parts");
        assert!(parts.is_some_and(|n| n >= 12), "{parts:?} parts");
    }
    s.kill();
    s.restart();
    let stored = read(s.all_events("/v1/projects/acme/streams/large").await);
    assert!(stored["payload"]["blob"] == big.as_str(), "the stored read");
    assert_eq!(stored, cached);
    let (status, again) = s
        .post(
            "/v1/projects/acme/streams/large:append",
            json!({"events": [event]}),
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["events"][0]["offset"], offset, "{again}");
    let other = json!({"type": "x.y/big", "payload": {"blob": "small"}, "idempotencyKey": "big-1"});
    let refused = s
        .post(
            "/v1/projects/acme/streams/large:append",
            json!({"events": [other]}),
        )
        .await;
    assert_error(&refused, 409, "idempotency-conflict", "big-1");
}
