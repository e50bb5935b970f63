//! Ingest with broker acceptance: HTTP acceptance (durable, deduplicated,
//! bounded, held for paused streams, surviving kill -9) and the JetStream
//! bridge against a real nats-server.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use serde_json::{json, Value};

use crate::support::{assert_error, run_cli, wait_for, NatsServer, Server, TOKENS};

pub(crate) const STREAM: &str = "/v1/projects/acme/streams/orders";
pub(crate) const INGEST: &str = "/v1/projects/acme/ingest/orders";

pub(crate) fn order(key: &str, n: u64) -> Value {
    json!({"type": "order-placed", "payload": {"n": n}, "idempotencyKey": key})
}

/// The data events of a stream (not its control events), as (key, n).
pub(crate) async fn orders(server: &Server, stream: &str) -> Vec<(String, u64)> {
    if server.get(&format!("{stream}:events?limit=1")).await.0 == 404 {
        return Vec::new();
    }
    server
        .all_events(stream)
        .await
        .into_iter()
        .filter(|e| e["type"] == "order-placed")
        .map(|e| {
            (
                e["idempotencyKey"].as_str().unwrap().to_string(),
                e["payload"]["n"].as_u64().unwrap(),
            )
        })
        .collect()
}

pub(crate) async fn wait_orders(server: &Server, stream: &str, n: usize) -> Vec<(String, u64)> {
    wait_for(
        &format!("{n} orders in {stream}"),
        Duration::from_secs(20),
        async || orders(server, stream).await.len() >= n,
    )
    .await;
    orders(server, stream).await
}

/// Pauses (or resumes) a stream: its appends are refused meanwhile.
pub(crate) async fn set_paused(server: &Server, stream: &str, paused: bool) {
    let kind = if paused { "paused" } else { "resumed" };
    let event = json!({"type": format!("events.iterate.com/stream/{kind}")});
    let (status, out) = server
        .post(&format!("{stream}:append"), json!({"events": [event]}))
        .await;
    assert_eq!(status, 200, "{out}");
}

/// Waits until the bridge reports an error containing every one of `parts`.
async fn wait_bridge_error(server: &Server, parts: &[&str]) {
    wait_for(
        &format!("the bridge to report {parts:?}"),
        Duration::from_secs(20),
        async || {
            ingest_status(server).await["nats"]["lastError"]
                .as_str()
                .is_some_and(|e| parts.iter().all(|p| e.contains(p)))
        },
    )
    .await;
}

/// Deletes the JetStream stream and creates it again, safely configured:
/// a new incarnation. The bridge creates the stream when it finds it
/// absent, so the two creations may race (nats-server then fails one with
/// "error creating store for stream"): whichever lands is the new one.
async fn recreate_safely(js: &jetstream::Context) {
    js.delete_stream("STREAMHOST_INGEST").await.unwrap();
    wait_for(
        "the stream created again",
        Duration::from_secs(10),
        async || {
            js.create_stream(streamhost::ingest::nats::safe_config(
                streamhost::config::NatsStorage::File,
                1,
            ))
            .await
            .is_ok()
        },
    )
    .await;
}

pub(crate) async fn ingest_status(server: &Server) -> Value {
    let (status, body) = server.get("/v1/ingest").await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn wait_http_drained(server: &Server) {
    wait_for("HTTP ingest drained", Duration::from_secs(20), async || {
        ingest_status(server).await["http"]["pending"] == 0
    })
    .await;
}

#[tokio::test]
async fn ingest_accepts_durably_and_appends_in_order_once() {
    let server = Server::start();
    let events: Vec<Value> = (1..=5).map(|n| order(&format!("o-{n}"), n)).collect();
    let (status, body) = server.post(INGEST, json!({"events": events})).await;
    assert_eq!((status, body), (202, json!({"accepted": 5})));
    let got = wait_orders(&server, STREAM, 5).await;
    let want = numbered_orders(1, 5);
    assert_eq!(got, want);

    // A retried acceptance (an unknown outcome retried) is accepted again and
    // appends nothing twice, whether its events were appended or are pending.
    let (status, body) = server.post(INGEST, json!({"events": events})).await;
    assert_eq!((status, body), (202, json!({"accepted": 5})));
    let more = vec![order("o-5", 5), order("o-6", 6), order("o-6", 6)];
    let (status, _) = server.post(INGEST, json!({"events": more})).await;
    assert_eq!(status, 202);
    wait_orders(&server, STREAM, 6).await;
    wait_http_drained(&server).await;
    let got = orders(&server, STREAM).await;
    assert_eq!(got.len(), 6, "{got:?}");
    assert_eq!(got[5], ("o-6".to_string(), 6));

    // A key reused with other content is a conflict, against the stream or
    // within the request; nothing of the request is accepted.
    let conflict = server
        .post(
            INGEST,
            json!({"events": [order("o-7", 7), order("o-1", 99)]}),
        )
        .await;
    assert_error(&conflict, 409, "idempotency-conflict", "\"o-1\"");
    let twice = server
        .post(
            INGEST,
            json!({"events": [order("o-8", 8), order("o-8", 9)]}),
        )
        .await;
    assert_error(&twice, 409, "idempotency-conflict", "events[1]");
    assert_eq!(ingest_status(&server).await["http"]["pending"], 0);
    assert_eq!(orders(&server, STREAM).await.len(), 6);
}

#[tokio::test]
async fn racing_acceptances_of_one_key_with_other_content_accept_one() {
    let server = Server::start();
    for i in 0..20u64 {
        let key = format!("race-{i}");
        let (a, b) = tokio::join!(
            server.post(INGEST, json!({"events": [order(&key, 1)]})),
            server.post(INGEST, json!({"events": [order(&key, 2)]})),
        );
        let mut statuses = [a.0, b.0];
        statuses.sort();
        assert_eq!(statuses, [202, 409], "{a:?} {b:?}");
        let conflict = if a.0 == 409 { &a } else { &b };
        assert_eq!(
            conflict.1["error"]["code"], "idempotency-conflict",
            "{conflict:?}"
        );
    }
    wait_orders(&server, STREAM, 20).await;
    wait_http_drained(&server).await;
    let got = orders(&server, STREAM).await;
    assert_eq!(got.len(), 20, "{got:?}");
}

#[tokio::test]
async fn ingest_status_is_for_admins_and_ingest_for_the_projects_token() {
    let server = Server::start_with(Some(TOKENS), &[]);
    let event = json!({"events": [order("k", 1)]});
    assert_eq!(
        server
            .post_as(Some("t-acme"), INGEST, event.clone())
            .await
            .0,
        202
    );
    let other = server
        .post_as(Some("t-acme"), "/v1/projects/other/ingest/x", event.clone())
        .await;
    assert_eq!(other.0, 403, "{}", other.1);
    assert_eq!(server.post_as(None, INGEST, event).await.0, 401);
    let forbidden = server.get_as(Some("t-acme"), "/v1/ingest").await;
    assert_eq!(forbidden.0, 403, "{}", forbidden.1);
    let (status, body) = server.get_as(Some("t-admin"), "/v1/ingest").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["nats"], Value::Null, "no bridge configured");
    let register = server
        .post_as(Some("t-admin"), "/v1/ingest:register", json!({}))
        .await;
    assert_error(&register, 404, "nats-not-configured", "--nats");
}

#[tokio::test]
async fn ingest_refuses_bad_events_at_acceptance() {
    let server = Server::start_with(Some("[ingest]\nmax-event-bytes = 200\n"), &[]);
    let no_key = server
        .post(INGEST, json!({"events": [{"type": "x"}]}))
        .await;
    assert_error(
        &no_key,
        400,
        "invalid-request",
        "events[0].idempotencyKey is required",
    );
    let platform = server
        .post(
            INGEST,
            json!({"events": [order("a", 1), {"type": "events.iterate.com/stream/subscription-delivery-halted", "idempotencyKey": "h"}]}),
        )
        .await;
    assert_error(&platform, 403, "platform-authored", "events[1]");
    let offset = server
        .post(
            INGEST,
            json!({"events": [{"type": "x", "idempotencyKey": "k", "offset": 2}]}),
        )
        .await;
    assert_error(&offset, 400, "invalid-request", "events[0].offset");
    let big = server
        .post(
            INGEST,
            json!({"events": [{"type": "x", "idempotencyKey": "k", "payload": {"s": "x".repeat(300)}}]}),
        )
        .await;
    assert_error(&big, 413, "too-large", "max-event-bytes");
    let empty = server.post(INGEST, json!({"events": []})).await;
    assert_error(&empty, 400, "invalid-request", "events is empty");
    let bad_path = server
        .post(
            "/v1/projects/acme/ingest/a%20b",
            json!({"events": [order("k", 1)]}),
        )
        .await;
    assert_eq!(bad_path.0, 400, "{}", bad_path.1);
    // Nothing of these was accepted, and no stream was created.
    assert_eq!(ingest_status(&server).await["http"]["pending"], 0);
    assert_eq!(server.get(&format!("{STREAM}:events")).await.0, 404);
}

#[tokio::test]
async fn ingest_at_capacity_refuses_new_work_keeps_what_it_accepted_and_paused_streams_hold() {
    let server = Server::start_with(
        Some("[ingest]\nmax-pending-events = 5\nmax-pending-events-per-project = 5\n"),
        &[],
    );
    set_paused(&server, STREAM, true).await;
    let events: Vec<Value> = (1..=4).map(|n| order(&format!("o-{n}"), n)).collect();
    assert_eq!(server.post(INGEST, json!({"events": events})).await.0, 202);
    let other = "/v1/projects/acme/ingest/other";
    assert_eq!(
        server
            .post(other, json!({"events": [order("x-1", 1)]}))
            .await
            .0,
        202
    );
    // The other stream drains (its capacity comes back); the paused one holds.
    wait_orders(&server, "/v1/projects/acme/streams/other", 1).await;
    wait_for("pending back to 4", Duration::from_secs(10), async || {
        ingest_status(&server).await["http"]["pending"] == 4
    })
    .await;
    assert_eq!(
        server
            .post(INGEST, json!({"events": [order("o-5", 5)]}))
            .await
            .0,
        202
    );
    let response = reqwest::Client::new()
        .post(format!("{}{INGEST}", server.url))
        .json(&json!({"events": [order("o-6", 6)]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "capacity-exhausted", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("5 of 5 events pending"),
        "{body}"
    );
    let status = ingest_status(&server).await;
    assert_eq!(status["http"]["pending"], 5, "{status}");
    assert_eq!(status["http"]["capacity"]["events"], 5, "{status}");
    // Operators see it in /metrics too, by project.
    assert_eq!(
        server
            .metric("streamhost_ingest_pending_events{project=\"acme\"}")
            .await,
        5
    );
    assert!(
        server
            .metric("streamhost_ingest_pending_bytes{project=\"acme\"}")
            .await
            > 0
    );
    assert!(status["http"]["bytes"].as_u64().unwrap() > 0);
    assert!(orders(&server, STREAM).await.is_empty());

    // Resumed, the held events arrive in acceptance order and capacity frees.
    set_paused(&server, STREAM, false).await;
    let got = wait_orders(&server, STREAM, 5).await;
    let want = numbered_orders(1, 5);
    assert_eq!(got, want);
    wait_http_drained(&server).await;
    assert_eq!(ingest_status(&server).await["http"]["bytes"], 0);
    assert_eq!(
        server
            .post(INGEST, json!({"events": [order("o-6", 6)]}))
            .await
            .0,
        202
    );
    wait_orders(&server, STREAM, 6).await;
}

#[tokio::test]
async fn ingest_loses_nothing_accepted_across_kill_9() {
    let mut server = Server::start();
    // Held by a pause, then killed: the accepted events are in the database.
    set_paused(&server, STREAM, true).await;
    for batch in 0..4u64 {
        let events: Vec<Value> = (1..=25)
            .map(|i| batch * 25 + i)
            .map(|n| order(&format!("o-{n}"), n))
            .collect();
        assert_eq!(server.post(INGEST, json!({"events": events})).await.0, 202);
    }
    server.restart();
    assert_eq!(ingest_status(&server).await["http"]["pending"], 100);
    set_paused(&server, STREAM, false).await;
    // Killed again while draining: the restarted drain appends the rest, and
    // what was appended before the kill is not appended twice.
    wait_for("the drain started", Duration::from_secs(20), async || {
        !orders(&server, STREAM).await.is_empty()
    })
    .await;
    server.restart();
    let got = wait_orders(&server, STREAM, 100).await;
    wait_http_drained(&server).await;
    let got_after = orders(&server, STREAM).await;
    assert_eq!(got_after.len(), 100, "{got:?}");
    let want = numbered_orders(1, 100);
    assert_eq!(got_after, want);
}

// --- The JetStream bridge -------------------------------------------------

pub(crate) const SUBJECT: &str = "streamhost.acme.ingest.orders.eu";
pub(crate) const BRIDGED: &str = "/v1/projects/acme/streams/orders/eu";

pub(crate) async fn publish(
    js: &jetstream::Context,
    subject: &str,
    msg_id: Option<&str>,
    body: &[u8],
) -> u64 {
    let mut headers = async_nats::HeaderMap::new();
    if let Some(id) = msg_id {
        headers.insert("Nats-Msg-Id", id);
    }
    js.publish_with_headers(subject.to_string(), headers, body.to_vec().into())
        .await
        .expect("publishing")
        .await
        .expect("a PubAck: broker acceptance")
        .sequence
}

pub(crate) async fn publish_orders(js: &jetstream::Context, from: u64, to: u64) {
    for n in from..=to {
        let body = json!({"type": "order-placed", "payload": {"n": n}}).to_string();
        publish(js, SUBJECT, Some(&format!("o-{n}")), body.as_bytes()).await;
    }
}

/// Waits until every message left JetStream (its capacity reclaimed).
pub(crate) async fn wait_jetstream_empty(js: &jetstream::Context) {
    wait_for(
        "JetStream stream empty",
        Duration::from_secs(20),
        async || messages_in(js).await == 0,
    )
    .await;
}

/// Orders `o-from`..=`o-to` as `orders` reads them.
pub(crate) fn numbered_orders(from: u64, to: u64) -> Vec<(String, u64)> {
    (from..=to).map(|n| (format!("o-{n}"), n)).collect()
}

pub(crate) async fn messages_in(js: &jetstream::Context) -> u64 {
    let mut s = js
        .get_stream("STREAMHOST_INGEST")
        .await
        .expect("the stream");
    s.info().await.expect("stream info").state.messages
}

async fn wait_consuming(server: &Server) -> Value {
    wait_for(
        "the bridge consuming",
        Duration::from_secs(20),
        async || ingest_status(server).await["nats"]["consuming"] == true,
    )
    .await;
    ingest_status(server).await["nats"].clone()
}

fn bridged_server(nats: &NatsServer) -> Server {
    Server::start_with(None, &["--nats", &nats.url])
}

#[tokio::test]
async fn the_bridge_creates_a_safe_stream_and_appends_in_order_keyed_by_msg_id() {
    let nats = NatsServer::start();
    let server = bridged_server(&nats);
    let status = wait_consuming(&server).await;
    assert_eq!(status["stream"], "STREAMHOST_INGEST");
    assert_eq!(status["fence"]["account"], "$G", "{status}");
    assert!(status["fence"]["created"]
        .as_str()
        .unwrap()
        .starts_with("20"));

    let js = nats.jetstream().await;
    let mut s = js.get_stream("STREAMHOST_INGEST").await.unwrap();
    let c = s.info().await.unwrap().config.clone();
    assert_eq!(c.storage, stream::StorageType::File);
    assert_eq!(c.retention, stream::RetentionPolicy::Limits);
    assert_eq!(c.discard, stream::DiscardPolicy::New);
    assert_eq!(c.max_age, Duration::ZERO);
    assert_eq!(
        (c.max_messages, c.max_bytes, c.max_message_size),
        (50_000, 512 * 1024 * 1024, 1024 * 1024)
    );
    assert!(!c.allow_rollup && !c.allow_message_ttl && !c.deny_delete);
    assert_eq!(
        c.subjects,
        vec!["streamhost.*.ingest.>", "streamhost.*.resume.>"]
    );
    assert_eq!(c.num_replicas.max(1), 1);

    publish_orders(&js, 1, 30).await;
    let got = wait_orders(&server, BRIDGED, 30).await;
    let want = numbered_orders(1, 30);
    assert_eq!(got, want);
    // Capacity is reclaimed: each message was deleted after its append.
    wait_jetstream_empty(&js).await;
    assert_eq!(orders(&server, BRIDGED).await.len(), 30);
}

#[tokio::test]
async fn the_bridge_parks_bad_messages_with_their_bytes_and_deletes_them() {
    let nats = NatsServer::start();
    let server = bridged_server(&nats);
    wait_consuming(&server).await;
    let js = nats.jetstream().await;
    // A reactor on /users refuses a sign-up without a userId for good.
    let users = "/v1/projects/acme/streams/users";
    crate::reactors::welcome_reactor(&server, users, "welcome.v1").await;
    crate::effects::deploy(&server, "welcome", "welcome").await;
    let sign_up =
        |user: Option<&str>| crate::reactors::sign_up(user, "http://127.0.0.1:9/").to_string();
    let refused = publish(
        &js,
        "streamhost.acme.ingest.users",
        Some("n-1"),
        sign_up(None).as_bytes(),
    )
    .await;
    publish(
        &js,
        "streamhost.acme.ingest.users",
        Some("n-2"),
        sign_up(Some("ada")).as_bytes(),
    )
    .await;
    let no_id = publish(&js, SUBJECT, None, br#"{"type":"order-placed"}"#).await;
    let not_json = publish(&js, SUBJECT, Some("b-1"), b"not json").await;
    let platform = publish(
        &js,
        SUBJECT,
        Some("b-2"),
        br#"{"type":"events.iterate.com/stream/subscription-delivery-halted"}"#,
    )
    .await;
    let bad_project = publish(
        &js,
        "streamhost.Bad_Project.ingest.x",
        Some("b-3"),
        br#"{"type":"x"}"#,
    )
    .await;
    publish_orders(&js, 1, 1).await;
    wait_orders(&server, BRIDGED, 1).await;
    wait_for("five diagnostics", Duration::from_secs(10), async || {
        ingest_status(&server).await["nats"]["diagnostics"]
            .as_array()
            .is_some_and(|d| d.len() == 5)
    })
    .await;
    let d = ingest_status(&server).await["nats"]["diagnostics"].clone();
    // The reactor's refusal comes at append time, the others on arrival.
    let (at_append, on_arrival): (Vec<&Value>, Vec<&Value>) = d
        .as_array()
        .unwrap()
        .iter()
        .partition(|x| x["sequence"] == refused);
    assert_eq!(at_append.len(), 1, "{d}");
    let seqs: Vec<u64> = on_arrival
        .iter()
        .map(|x| x["sequence"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![no_id, not_json, platform, bad_project], "{d}");
    let reasons: Vec<&str> = on_arrival
        .iter()
        .map(|x| x["reason"].as_str().unwrap())
        .collect();
    assert!(reasons[0].contains("Nats-Msg-Id"), "{d}");
    assert!(reasons[1].contains("not an event"), "{d}");
    assert!(reasons[2].contains("platform-authored"), "{d}");
    assert!(reasons[3].contains("Bad_Project"), "{d}");
    wait_jetstream_empty(&js).await;
    assert_eq!(orders(&server, BRIDGED).await.len(), 1);

    // Each is parked with its whole input, for its project (the one whose
    // subject names no valid project has none to list it under).
    let (status, page) = server.get("/v1/projects/acme/ingest/parked").await;
    assert_eq!(status, 200, "{page}");
    let parked = page["parked"].as_array().unwrap().clone();
    let mut seqs: Vec<u64> = parked
        .iter()
        .map(|p| p["nats"]["sequence"].as_u64().unwrap())
        .collect();
    // In the order they were parked: the reactor's refusal at its append.
    seqs.sort();
    let mut want = vec![refused, no_id, not_json, platform];
    want.sort();
    assert_eq!(seqs, want, "{page}");
    let by_seq = |seq: u64| {
        parked
            .iter()
            .find(|p| p["nats"]["sequence"] == seq)
            .unwrap()
            .clone()
    };
    let raw = |p: &Value| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(p["nats"]["raw"].as_str().unwrap())
            .unwrap()
    };
    let p = by_seq(not_json);
    assert_eq!(
        (&p["source"], &p["path"], &p["event"]),
        (&json!("nats"), &json!("/orders/eu"), &Value::Null),
        "{p}"
    );
    assert_eq!(p["nats"]["subject"], SUBJECT);
    assert_eq!(raw(&p), b"not json");
    assert!(
        p["reason"].as_str().unwrap().contains("not an event"),
        "{p}"
    );
    let p = by_seq(refused);
    assert_eq!(
        (&p["path"], &p["event"]["idempotencyKey"]),
        (&json!("/users"), &json!("n-1")),
        "{p}"
    );
    assert_eq!(raw(&p), sign_up(None).as_bytes());
    assert!(
        p["reason"].as_str().unwrap().contains("has no userId"),
        "{p}"
    );
    // The sign-up behind the refused one went on.
    let types: Vec<Value> = server
        .all_events(users)
        .await
        .iter()
        .map(|e| e["payload"]["userId"].clone())
        .filter(|u| !u.is_null())
        .collect();
    assert_eq!(types, [json!("ada")]);
    let status = ingest_status(&server).await;
    assert_eq!(status["http"]["parked"], 5, "{status}");
    // A message that is not an event cannot be redriven; it is discarded.
    let id = by_seq(not_json)["id"].as_i64().unwrap();
    let (code, out) = server
        .post(
            &format!("/v1/projects/acme/ingest/parked/{id}:redrive"),
            json!({}),
        )
        .await;
    assert_eq!(code, 400, "{out}");
    assert!(
        out["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not an event"),
        "{out}"
    );
    let (code, out) = server
        .post(
            &format!("/v1/projects/acme/ingest/parked/{id}:discard"),
            json!({}),
        )
        .await;
    assert_eq!(code, 200, "{out}");
    assert_eq!(ingest_status(&server).await["http"]["parked"], 4);
}

#[tokio::test]
async fn the_bridge_loses_and_repeats_nothing_across_kill_9() {
    let nats = NatsServer::start();
    let mut server = bridged_server(&nats);
    wait_consuming(&server).await;
    let js = nats.jetstream().await;
    publish_orders(&js, 1, 200).await;
    wait_for(
        "the bridge started appending",
        Duration::from_secs(20),
        async || !orders(&server, BRIDGED).await.is_empty(),
    )
    .await;
    server.kill();
    // Published while the host is down: the broker keeps them.
    publish_orders(&js, 201, 220).await;
    server.restart();
    let got = wait_orders(&server, BRIDGED, 220).await;
    wait_jetstream_empty(&js).await;
    let got_after = orders(&server, BRIDGED).await;
    assert_eq!(got_after.len(), 220, "{got:?}");
    let want = numbered_orders(1, 220);
    assert_eq!(got_after, want);
}

#[tokio::test]
async fn a_recreated_jetstream_stream_is_refused_until_registered() {
    let nats = NatsServer::start();
    let mut server = bridged_server(&nats);
    let first = wait_consuming(&server).await;
    server.kill();
    let js = nats.jetstream().await;
    recreate_safely(&js).await;
    publish_orders(&js, 1, 1).await;
    server.restart();
    wait_bridge_error(&server, &["was recreated"]).await;
    let status = ingest_status(&server).await["nats"].clone();
    assert_eq!(status["consuming"], false, "{status}");
    assert!(orders(&server, BRIDGED).await.is_empty());
    assert_eq!(messages_in(&js).await, 1, "nothing was deleted");

    // Registration needs an empty stream.
    let (ok, _, err) = run_cli(&["ingest", "register", "--url", &server.url]);
    assert!(!ok);
    assert!(
        err.contains("registration-refused") && err.contains("holds 1 messages"),
        "{err}"
    );
    js.get_stream("STREAMHOST_INGEST")
        .await
        .unwrap()
        .purge()
        .await
        .unwrap();
    let (ok, out, err) = run_cli(&["ingest", "register", "--url", &server.url]);
    assert!(ok, "{err}");
    let registered: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(registered["consuming"], true);
    assert_ne!(registered["fence"]["created"], first["fence"]["created"]);
    publish_orders(&js, 2, 2).await;
    assert_eq!(
        wait_orders(&server, BRIDGED, 1).await,
        vec![("o-2".to_string(), 2)]
    );
    let (ok, out, _) = run_cli(&["ingest", "status", "--url", &server.url]);
    assert!(ok);
    assert!(out.contains("STREAMHOST_INGEST"), "{out}");
}

#[tokio::test]
async fn a_stream_recreated_while_the_bridge_consumes_is_neither_appended_nor_acked() {
    let nats = NatsServer::start();
    let server = bridged_server(&nats);
    wait_consuming(&server).await;
    let js = nats.jetstream().await;
    publish_orders(&js, 1, 3).await;
    wait_orders(&server, BRIDGED, 3).await;
    wait_jetstream_empty(&js).await;
    // Another incarnation under the same name (a new creation time) while
    // the bridge consumes: the identity it asks the broker for again no
    // longer matches its fence.
    recreate_safely(&js).await;
    publish_orders(&js, 4, 4).await;
    wait_bridge_error(&server, &["was recreated"]).await;
    assert_eq!(ingest_status(&server).await["nats"]["consuming"], false);
    assert_eq!(messages_in(&js).await, 1, "the message stays in the stream");
    assert_eq!(
        orders(&server, BRIDGED).await,
        numbered_orders(1, 3),
        "nothing of the new incarnation is appended"
    );
}

#[tokio::test]
async fn memory_storage_is_used_only_when_asked_for_capped_and_logged_as_not_durable() {
    let nats = NatsServer::start();
    let config = "[ingest]\nnats-storage = \"memory\"\n";
    let server = Server::start_with(Some(config), &["--nats", &nats.url]);
    wait_consuming(&server).await;
    let js = nats.jetstream().await;
    let mut s = js.get_stream("STREAMHOST_INGEST").await.unwrap();
    let c = s.info().await.unwrap().config.clone();
    assert_eq!(c.storage, stream::StorageType::Memory);
    assert_eq!(c.max_bytes, 20 * 1024 * 1024);
    assert!(
        server.log().contains("not durable"),
        "the log says so: {}",
        server.log()
    );
    publish_orders(&js, 1, 2).await;
    assert_eq!(
        wait_orders(&server, BRIDGED, 2).await,
        numbered_orders(1, 2)
    );
    // A host not asking for memory storage refuses that stream, naming it.
    let default = bridged_server(&nats);
    wait_bridge_error(
        &default,
        &["not configured safely", "storage is Memory, not File"],
    )
    .await;
    assert_eq!(ingest_status(&default).await["nats"]["consuming"], false);
}

#[tokio::test]
async fn a_registration_past_the_fence_bound_is_refused_naming_it() {
    let nats = NatsServer::start();
    let mut server = bridged_server(&nats);
    wait_consuming(&server).await;
    server.kill();
    // 1,023 identities registered before this one: 1,024, the bound.
    server.db().execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1023)
         INSERT INTO ingest_fences (account, domain, stream, created, registered_at)
         SELECT 'before', '', 'STREAMHOST_INGEST', 'created-' || i, '2026-12-01T00:00:00.000Z'
         FROM n",
    );
    let js = nats.jetstream().await;
    recreate_safely(&js).await;
    server.restart();
    wait_bridge_error(&server, &["was recreated"]).await;
    let (ok, _, err) = run_cli(&["ingest", "register", "--url", &server.url]);
    assert!(!ok);
    assert!(
        err.contains("registration-refused")
            && err.contains("1024 JetStream stream identities are registered already"),
        "{err}"
    );
    assert_eq!(ingest_status(&server).await["nats"]["consuming"], false);
    // With one fewer, the same registration goes through.
    server
        .db()
        .execute("DELETE FROM ingest_fences WHERE created = 'created-1'");
    let (ok, out, err) = run_cli(&["ingest", "register", "--url", &server.url]);
    assert!(ok, "{err}");
    let registered: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(registered["consuming"], true, "{registered}");
}

#[tokio::test]
async fn an_unsafe_or_unregistered_jetstream_stream_is_not_consumed() {
    let nats = NatsServer::start();
    let js = nats.jetstream().await;
    js.create_stream(stream::Config {
        name: "STREAMHOST_INGEST".into(),
        subjects: vec!["streamhost.*.ingest.>".into()],
        max_age: Duration::from_secs(3600),
        ..Default::default()
    })
    .await
    .unwrap();
    let server = bridged_server(&nats);
    wait_bridge_error(&server, &["not configured safely", "max age"]).await;
    drop(server);

    // Safe but holding messages it never registered: refused, kept.
    recreate_safely(&js).await;
    publish_orders(&js, 1, 2).await;
    let server = bridged_server(&nats);
    wait_bridge_error(&server, &["holds 2 messages but was never registered"]).await;
    assert_eq!(messages_in(&js).await, 2);
    assert!(orders(&server, BRIDGED).await.is_empty());
}

#[tokio::test]
async fn the_bridge_holds_a_paused_streams_messages_in_jetstream_until_resumed() {
    let nats = NatsServer::start();
    let server = bridged_server(&nats);
    wait_consuming(&server).await;
    set_paused(&server, BRIDGED, true).await;
    let js = nats.jetstream().await;
    publish_orders(&js, 1, 3).await;
    // Another stream's messages are not held up behind the paused one.
    let other = json!({"type": "order-placed", "payload": {"n": 9}}).to_string();
    publish(
        &js,
        "streamhost.acme.ingest.other",
        Some("x-9"),
        other.as_bytes(),
    )
    .await;
    wait_orders(&server, "/v1/projects/acme/streams/other", 1).await;
    wait_for(
        "the other stream's message deleted",
        Duration::from_secs(10),
        async || messages_in(&js).await == 3,
    )
    .await;
    // Held: still in JetStream (capacity taken), not appended.
    assert!(orders(&server, BRIDGED).await.is_empty());
    publish_orders(&js, 4, 4).await;
    set_paused(&server, BRIDGED, false).await;
    let got = wait_orders(&server, BRIDGED, 4).await;
    let want = numbered_orders(1, 4);
    assert_eq!(got, want);
    wait_jetstream_empty(&js).await;
}

/// An accepted event that can never be appended is parked, never dropped:
/// its project lists it (stream, event, reason, when) after a restart too,
/// the events beside it still arrive, and a redrive answers the append's
/// refusal until it is discarded.
#[tokio::test]
async fn an_event_refused_for_good_is_parked_across_a_restart_until_discarded() {
    let mut server = Server::start();
    // Held by a paused stream while the store is damaged under it.
    set_paused(&server, STREAM, true).await;
    let events = json!({"events": [order("o-1", 1), order("o-2", 2)]});
    assert_eq!(server.post(INGEST, events).await.0, 202);
    // The drain has read the rows and been refused: it reads them again
    // (damaged) on its next try, not the bodies it read before.
    wait_for(
        "the stream's ingest to show as blocked",
        Duration::from_secs(30),
        async || {
            ingest_status(&server).await["http"]["blocked"]
                .as_array()
                .is_some_and(|b| b.iter().any(|s| s["path"] == "/orders"))
        },
    )
    .await;
    server.db().execute(
        "UPDATE ingest_pending SET body = '{\"type\":\"events.iterate.com/stream/subscription-delivery-halted\",\"idempotencyKey\":\"o-1\"}' WHERE idempotency_key = 'o-1'",
    );
    set_paused(&server, STREAM, false).await;
    let got = wait_orders(&server, STREAM, 1).await;
    assert_eq!(got, vec![("o-2".to_string(), 2)]);
    wait_http_drained(&server).await;
    let parked = async |server: &Server| {
        let (status, page) = server
            .get("/v1/projects/acme/ingest/parked?path=/orders")
            .await;
        assert_eq!(status, 200, "{page}");
        page["parked"].as_array().expect("parked").clone()
    };
    let check = |p: &[Value]| {
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0]["path"], "/orders");
        assert_eq!(p[0]["source"], "http");
        assert_eq!(p[0]["event"]["idempotencyKey"], "o-1");
        let reason = p[0]["reason"].as_str().unwrap();
        assert!(reason.contains("platform-authored"), "{reason}");
        assert!(p[0]["parkedAt"].as_str().unwrap().ends_with('Z'));
    };
    check(&parked(&server).await);
    let status = ingest_status(&server).await;
    assert_eq!(
        (&status["http"]["parked"], &status["http"]["pending"]),
        (&json!(1), &json!(0)),
        "{status}"
    );
    server.kill();
    server.restart();
    let p = parked(&server).await;
    check(&p);
    let id = p[0]["id"].as_i64().unwrap();
    // Another stream's filter lists none of it.
    let (_, other) = server
        .get("/v1/projects/acme/ingest/parked?path=/other")
        .await;
    assert_eq!(other["parked"], json!([]), "{other}");
    // The command line: list, redrive (refused again), discard.
    let cli = |verb: &str, extra: &[&str]| {
        let mut args = vec!["ingest", verb, "--url", &server.url, "--project", "acme"];
        args.extend_from_slice(extra);
        run_cli(&args)
    };
    let (ok, out, err) = cli("parked", &["--path", "/orders"]);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["parked"][0]["id"], id, "{out}");
    let id_arg = id.to_string();
    let (ok, _, err) = cli("redrive", &[&id_arg]);
    assert!(!ok);
    assert!(err.contains("platform-authored"), "{err}");
    let (ok, out, err) = cli("discard", &[&id_arg]);
    assert!(ok, "{err}");
    let discarded: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(discarded["discarded"]["id"], id, "{out}");
    assert!(parked(&server).await.is_empty());
    assert_eq!(ingest_status(&server).await["http"]["bytes"], 0);
    let types: Vec<String> = server
        .all_events("/v1/projects/acme/streams/orders")
        .await
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .filter(|t| t == "order-placed" || t.ends_with("/error-occurred"))
        .collect();
    assert_eq!(
        types,
        ["order-placed", "events.iterate.com/stream/error-occurred"]
    );
}

/// The parked-event routes answer bad ids, verbs and methods plainly.
#[tokio::test]
async fn parked_event_routes_refuse_bad_ids_verbs_and_methods() {
    let server = Server::start();
    for (method, path, status, code) in [
        (
            "POST",
            "/v1/projects/acme/ingest/parked/0:redrive",
            400,
            "invalid-request",
        ),
        (
            "POST",
            "/v1/projects/acme/ingest/parked/x:discard",
            400,
            "invalid-request",
        ),
        (
            "POST",
            "/v1/projects/acme/ingest/parked/7:explode",
            404,
            "method-not-found",
        ),
        (
            "POST",
            "/v1/projects/acme/ingest/parked/7:redrive",
            404,
            "parked-event-not-found",
        ),
        (
            "GET",
            "/v1/projects/acme/ingest/parked/7:redrive",
            405,
            "method-not-allowed",
        ),
        (
            "DELETE",
            "/v1/projects/acme/ingest/parked",
            405,
            "method-not-allowed",
        ),
        (
            "GET",
            "/v1/projects/acme/ingest/parked?limit=0",
            400,
            "invalid-request",
        ),
        (
            "GET",
            "/v1/projects/acme/ingest/parked?colour=red",
            400,
            "invalid-request",
        ),
        (
            "GET",
            "/v1/projects/acme/ingest/orders",
            405,
            "method-not-allowed",
        ),
    ] {
        let (got, body) = server.send(method, path).await;
        assert_eq!(
            (got, body["error"]["code"].as_str()),
            (status, Some(code)),
            "{method} {path}: {body}"
        );
    }
    // A stream named `parked` still takes ingest.
    let (status, out) = server
        .post(
            "/v1/projects/acme/ingest/parked",
            json!({"events": [order("p-1", 1)]}),
        )
        .await;
    assert_eq!(status, 202, "{out}");
    wait_orders(&server, "/v1/projects/acme/streams/parked", 1).await;
}

/// The drain works on each stream by itself: a stream with a long backlog
/// holds up no other project's events accepted after its drain began.
#[tokio::test]
async fn a_streams_long_backlog_holds_up_no_other_projects_ingest() {
    let s = Server::start();
    let pad = "x".repeat(8 * 1024);
    // The backlog is accepted while /bulk is paused, so all of it is
    // pending when its drain begins (accepted as it drained, it would be a
    // single append behind at the end).
    const BULK: &str = "/v1/projects/bulk/streams/bulk";
    set_paused(&s, BULK, true).await;
    // 6,000 events of 8 KiB for /bulk of project bulk: a dozen appends.
    for batch in 0..12 {
        let events: Vec<Value> = (0..500)
            .map(|i| {
                let n = batch * 500 + i;
                json!({"type": "bulk-loaded", "payload": {"n": n, "pad": pad},
                    "idempotencyKey": format!("b-{n}")})
            })
            .collect();
        let (status, out) = s
            .post("/v1/projects/bulk/ingest/bulk", json!({ "events": events }))
            .await;
        assert_eq!(status, 202, "{out}");
    }
    let bulk_head = async || {
        let (_, st) = s.get(&format!("{BULK}:state")).await;
        st["maxOffset"].as_u64().unwrap_or(0)
    };
    // The created, paused and resumed events, then the backlog.
    let resumed = bulk_head().await + 1;
    let full = resumed + 6_000;
    set_paused(&s, BULK, false).await;
    wait_for(
        "the bulk drain to begin",
        Duration::from_secs(60),
        async || bulk_head().await > resumed,
    )
    .await;
    let (status, out) = s
        .post(
            "/v1/projects/quiet/ingest/orders",
            json!({"events": [order("q-1", 1)]}),
        )
        .await;
    assert_eq!(status, 202, "{out}");
    wait_orders(&s, "/v1/projects/quiet/streams/orders", 1).await;
    // The quiet project's event went in while the backlog was still
    // draining.
    let at = bulk_head().await;
    assert!(
        at < full,
        "the quiet event waited for the whole backlog (head {at} of {full})"
    );
    wait_http_drained(&s).await;
    assert_eq!(bulk_head().await, full);
}

/// The copy subscription `h` on `BRIDGED`, halted: its transform throws on
/// every event, so each resume delivers again and halts again.
pub(crate) async fn halted_subscription(server: &Server) {
    let receiver = json!({"action": "copy-to-stream", "receivingStreamPath": "/orders/eu-out",
        "jsonataTransform": "$error(\"no\")", "delivery": {"start": "now", "onFailingEvent": "halt"}});
    let configured = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "h", "receiver": receiver}});
    for event in [configured, json!({"type": "x.y/e"})] {
        let (status, out) = server
            .post(&format!("{BRIDGED}:append"), json!({"events": [event]}))
            .await;
        assert_eq!(status, 200, "{out}");
    }
    server
        .wait_halted(BRIDGED, "h", Duration::from_secs(20))
        .await;
}

/// The events of `BRIDGED` of one platform type (its last word).
pub(crate) async fn control_events(server: &Server, kind: &str) -> Vec<Value> {
    server
        .all_events(BRIDGED)
        .await
        .into_iter()
        .filter(|e| e["type"] == format!("events.iterate.com/stream/subscription-delivery-{kind}"))
        .collect()
}

/// Waits until subscription `h` halted `n` times.
pub(crate) async fn wait_halts(server: &Server, n: usize) {
    wait_for(
        &format!("{n} halts of h"),
        Duration::from_secs(20),
        async || control_events(server, "halted").await.len() >= n,
    )
    .await;
}

pub(crate) const RESUME_SUBJECT: &str = "streamhost.acme.resume.orders.eu";

/// Publishes a resume of subscription `h` of `BRIDGED` keyed `msg_id`.
pub(crate) async fn publish_resume(js: &jetstream::Context, msg_id: &str) {
    publish(
        js,
        RESUME_SUBJECT,
        Some(msg_id),
        br#"{"subscriptionKey": "h"}"#,
    )
    .await;
}

#[tokio::test]
async fn a_resume_message_resumes_a_halted_subscription_once_through_its_own_consumer() {
    let nats = NatsServer::start();
    let server = bridged_server(&nats);
    let status = wait_consuming(&server).await;
    assert_eq!(
        status["consumers"],
        json!([
            {"name": "streamhost-bridge", "filterSubject": "streamhost.*.ingest.>", "maxAckPending": 50000},
            {"name": "streamhost-resume", "filterSubject": "streamhost.*.resume.>", "maxAckPending": 50000},
        ]),
        "{status}"
    );
    // The broker has both durable consumers as shown.
    let js = nats.jetstream().await;
    let s = js.get_stream("STREAMHOST_INGEST").await.unwrap();
    for (name, subject) in [
        ("streamhost-bridge", "streamhost.*.ingest.>"),
        ("streamhost-resume", "streamhost.*.resume.>"),
    ] {
        let mut c: jetstream::consumer::PullConsumer = s.get_consumer(name).await.unwrap();
        let info = c.info().await.unwrap();
        assert_eq!(info.config.filter_subject, subject);
        assert_eq!(info.config.max_ack_pending, 50_000);
        assert_eq!(info.config.durable_name.as_deref(), Some(name));
    }

    halted_subscription(&server).await;
    publish_resume(&js, "resume-1").await;
    // Resumed: it delivers again (and its transform halts it again).
    wait_halts(&server, 2).await;
    let resumed = control_events(&server, "resumed").await;
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0]["idempotencyKey"], "resume-1", "{resumed:?}");
    assert_eq!(resumed[0]["payload"]["subscriptionKey"], "h");
    wait_jetstream_empty(&js).await;
    // Once: the same Nats-Msg-Id again (as a redelivery after a crash
    // before its ack) is a replay, not a second resume.
    let again = json!({"type": "events.iterate.com/stream/subscription-delivery-resumed",
        "payload": {"subscriptionKey": "h"}, "idempotencyKey": "resume-1"});
    let (status, out) = server
        .post(&format!("{BRIDGED}:append"), json!({"events": [again]}))
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(control_events(&server, "resumed").await.len(), 1);
    let state = server.get(&format!("{BRIDGED}:state")).await.1;
    assert!(
        state["subscriptions"]["outbound"]["byKey"]["h"]["deliveryHalted"].is_object(),
        "still halted: {state}"
    );

    // Resumes that can never apply are diagnostics, and leave the stream.
    publish(
        &js,
        RESUME_SUBJECT,
        Some("resume-2"),
        br#"{"subscriptionKey": "nope"}"#,
    )
    .await;
    publish(&js, RESUME_SUBJECT, None, br#"{"subscriptionKey": "h"}"#).await;
    publish(&js, RESUME_SUBJECT, Some("resume-3"), b"resume please").await;
    wait_for("three diagnostics", Duration::from_secs(20), async || {
        let status = ingest_status(&server).await;
        let reasons: Vec<&str> = status["nats"]["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["reason"].as_str().unwrap())
            .collect();
        ["subscription \"nope\"", "no Nats-Msg-Id", "is not {"]
            .iter()
            .all(|r| reasons.iter().any(|x| x.contains(r)))
    })
    .await;
    wait_jetstream_empty(&js).await;
    assert_eq!(control_events(&server, "resumed").await.len(), 1);
    // Events go on through their own consumer meanwhile.
    publish_orders(&js, 1, 3).await;
    assert_eq!(
        wait_orders(&server, BRIDGED, 3).await,
        numbered_orders(1, 3)
    );
}

#[tokio::test]
async fn startup_updates_a_registered_streams_safe_fields_in_place_and_stays_fenced_when_it_cannot()
{
    let nats = NatsServer::start();
    let js = nats.jetstream().await;
    // As an older build created it: events' subjects only, and a lower
    // byte limit.
    let mut older = streamhost::ingest::nats::safe_config(streamhost::config::NatsStorage::File, 1);
    older.subjects = vec!["streamhost.*.ingest.>".into()];
    older.max_bytes = 64 * 1024 * 1024;
    let created = js.create_stream(older).await.unwrap().cached_info().created;
    let mut server = bridged_server(&nats);
    let status = wait_consuming(&server).await;
    assert_eq!(
        status["updated"],
        json!([
            "subjects lack [\"streamhost.*.resume.>\"]",
            "max bytes is 67108864, raised to 536870912"
        ]),
        "{status}"
    );
    let mut s = js.get_stream("STREAMHOST_INGEST").await.unwrap();
    let info = s.info().await.unwrap().clone();
    assert_eq!(
        info.config.subjects,
        vec!["streamhost.*.ingest.>", "streamhost.*.resume.>"]
    );
    assert_eq!(info.config.max_bytes, 512 * 1024 * 1024);
    assert_eq!(
        info.created, created,
        "updated in place: the same incarnation"
    );
    publish_orders(&js, 1, 2).await;
    assert_eq!(
        wait_orders(&server, BRIDGED, 2).await,
        numbered_orders(1, 2)
    );
    wait_jetstream_empty(&js).await;
    server.kill();

    // An update the broker refuses (three replicas on a single server):
    // the error says what and why, and nothing is consumed.
    let three = Server::start_with(
        Some("[ingest]\nnats-replicas = 3\n"),
        &["--nats", &nats.url],
    );
    wait_bridge_error(
        &three,
        &[
            "updating JetStream stream STREAMHOST_INGEST in place (replicas are 1, set to 3) failed",
            "not consumed",
        ],
    )
    .await;
    publish_orders(&js, 3, 3).await;
    assert_eq!(ingest_status(&three).await["nats"]["consuming"], false);
    assert!(orders(&three, BRIDGED).await.is_empty());
    assert_eq!(messages_in(&js).await, 1, "the message stays in JetStream");
    assert_eq!(
        js.get_stream("STREAMHOST_INGEST")
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .config
            .num_replicas
            .max(1),
        1
    );
}
