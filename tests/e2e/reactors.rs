//! Reactors: effects committed with their events. The `welcome` example
//! (a reactor and a processor in one component) sends one webhook per new
//! user; a sign-up without a `userId` is refused by the reactor, and with
//! it the whole append.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::{json, Value};

use crate::effects::{all_effects, deploy, Receiver, EFFECTS};
use crate::support::{assert_error, post_until_ok, wait_for, Server};

const USERS: &str = "/v1/projects/acme/streams/users";
const CONFIGURED: &str = "events.iterate.com/stream/subscription-configured";

/// Configures reactor `name` (component `welcome`) on `stream`.
async fn configure(s: &Server, stream: &str, name: &str) -> (u16, Value) {
    s.post(
        &format!("{stream}:append"),
        json!({"events": [{"type": CONFIGURED, "payload": {
            "subscriptionKey": name,
            "filter": {"eventTypes": ["user-signed-up"]},
            "receiver": {"action": "reactor",
                "expression": ["components", ["get", "welcome"], "react"]}}}]}),
    )
    .await
}

/// Configures reactor `name` (component `welcome`, on sign-ups) on
/// `stream` (a full path), asserting it was.
pub(crate) async fn welcome_reactor(s: &Server, stream: &str, name: &str) {
    let (status, out) = configure(s, stream, name).await;
    assert_eq!(status, 200, "{out}");
}

/// A sign-up keyed `key` that the welcome reactor refuses for good (it
/// has no userId).
pub(crate) fn refused_sign_up(key: &str) -> Value {
    let mut event = sign_up(None, "http://127.0.0.1:9/");
    event["idempotencyKey"] = json!(key);
    event
}

/// Removes subscription `key` from `stream` (a full path).
pub(crate) async fn unsubscribe(s: &Server, stream: &str, key: &str) {
    let removed = json!({"events": [{"type": "events.iterate.com/stream/subscription-removed",
        "payload": {"subscriptionKey": key, "reason": "requested"}}]});
    let (status, out) = s.post(&format!("{stream}:append"), removed).await;
    assert_eq!(status, 200, "{out}");
}

pub(crate) fn sign_up(user: Option<&str>, url: &str) -> Value {
    let mut payload = json!({"email": "someone@example.com", "welcomeUrl": url});
    if let Some(user) = user {
        payload["userId"] = json!(user);
    }
    json!({"type": "user-signed-up", "payload": payload})
}

/// Appends `events` to the users stream; the answer.
async fn append_users(s: &Server, events: Value) -> (u16, Value) {
    s.post(&format!("{USERS}:append"), json!({ "events": events }))
        .await
}

async fn head(s: &Server, stream: &str) -> u64 {
    let (status, state) = s.get(&format!("{stream}:state")).await;
    assert_eq!(status, 200, "{state}");
    state["maxOffset"].as_u64().unwrap()
}

/// The effects of reactor `name`, by key.
async fn reactor_effects(s: &Server, name: &str) -> HashMap<String, Value> {
    all_effects(s, &format!("&component=reactor:{name}"))
        .await
        .into_iter()
        .map(|e| (e["key"].as_str().unwrap().to_string(), e))
        .collect()
}

#[tokio::test]
async fn a_reactor_commits_each_sign_ups_webhook_with_it_and_a_refused_sign_up_commits_nothing() {
    let r = Receiver::start().await;
    let s = Server::start_with(Some(EFFECTS), &[]);
    deploy(&s, "welcome", "welcome").await;
    let (status, out) = configure(&s, USERS, "welcome.v1").await;
    assert_eq!(status, 200, "{out}");
    let url = |user: &str| format!("{}/ok/welcome/{user}", r.base);

    // The effect is in the outbox when the append is acknowledged.
    let (status, out) = append_users(&s, json!([sign_up(Some("ada"), &url("ada"))])).await;
    assert_eq!(status, 200, "{out}");
    let offset = out["events"][0]["offset"].as_u64().unwrap();
    let effects = reactor_effects(&s, "welcome.v1").await;
    let ada = &effects["welcome:ada"];
    assert_eq!(ada["checkpointOffset"], offset, "{ada}");
    assert_eq!(ada["stream"], "/users", "{ada}");
    assert_eq!(
        ada["target"]["webhook"]["body"],
        json!({"userId": "ada", "email": "someone@example.com", "template": "welcome"})
    );
    // Its envelope: the reactor as consumer, the type and metadata it gave.
    assert_eq!(ada["consumer"], "welcome.v1", "{ada}");
    assert_eq!(ada["consumerKind"], "reactor", "{ada}");
    assert_eq!(ada["component"], "reactor:welcome.v1", "{ada}");
    assert_eq!(ada["type"], "SendWelcome", "{ada}");
    let correlation = format!("sign-up-{offset}");
    assert_eq!(
        ada["metadata"],
        json!({"correlationId": correlation}),
        "{ada}"
    );
    wait_for("ada's welcome", Duration::from_secs(30), async || {
        r.posts_to("/ok/welcome/ada").len() == 1
    })
    .await;
    let post = &r.posts_to("/ok/welcome/ada")[0];
    assert_eq!(post.key.as_deref(), Some(ada["id"].to_string().as_str()));
    assert_eq!(
        post.envelope,
        HashMap::from([
            (
                "streamhost-effect-consumer".to_string(),
                "reactor:welcome.v1".to_string()
            ),
            (
                "streamhost-effect-key".to_string(),
                "welcome:ada".to_string()
            ),
            (
                "streamhost-effect-type".to_string(),
                "SendWelcome".to_string()
            ),
            (
                "streamhost-effect-metadata".to_string(),
                json!({"correlationId": correlation}).to_string()
            ),
        ])
    );

    // A refusal commits nothing of its append: neither the good sign-up
    // before the bad one nor any effect.
    let before = head(&s, USERS).await;
    let refused = append_users(
        &s,
        json!([sign_up(Some("bob"), &url("bob")), sign_up(None, &url("x"))]),
    )
    .await;
    assert_error(&refused, 422, "reactor-failed", "welcome.v1");
    let message = refused.1["error"]["message"].as_str().unwrap();
    for part in [
        "events[1]",
        "has no userId",
        // Its component imports wasi:keyvalue (it is a processor too).
        "wasmtime run -S keyvalue --invoke 'react(",
        "welcome.wasm",
    ] {
        assert!(message.contains(part), "{message:?} should say {part:?}");
    }
    // The command reproduces the refusal under the plain wasmtime CLI.
    let repro = message
        .split("reproduce with `")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .expect("a repro command");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("welcome.wasm"),
        crate::support::guest("welcome"),
    )
    .unwrap();
    let (_, printed) = crate::support::run_repro(repro, dir.path());
    assert!(
        printed.contains("err(") && printed.contains("has no userId"),
        "{repro}\n{printed}"
    );
    assert_eq!(head(&s, USERS).await, before, "nothing committed");
    assert!(!reactor_effects(&s, "welcome.v1")
        .await
        .contains_key("welcome:bob"));

    // A second sign-up of ada: a new event, the same effect identity.
    let (status, out) = append_users(&s, json!([sign_up(Some("ada"), &url("ada"))])).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(reactor_effects(&s, "welcome.v1").await.len(), 1);

    // Events of other types do not run it (its filter).
    let (status, out) = append_users(&s, json!([{"type": "user-renamed", "payload": {}}])).await;
    assert_eq!(status, 200, "{out}");

    // Its name is its effects' identity: never reconfigured in place (the
    // same configuration again is a no-op that answers the first).
    let (status, again) = configure(&s, USERS, "welcome.v1").await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["events"][0]["offset"], 2, "{again}");
    let changed = append_users(
        &s,
        json!([{"type": CONFIGURED, "payload": {
            "subscriptionKey": "welcome.v1",
            "receiver": {"action": "reactor",
                "expression": ["components", ["get", "welcome"], "react"]}}}]),
    )
    .await;
    assert_error(&changed, 409, "reactor-name-taken", "welcome.v1");

    // Appends racing each other, half of them refused: each good one
    // commits with exactly its effect, each bad one commits nothing (a
    // refusal inside a round leaves the round's other requests alone).
    let before = head(&s, USERS).await;
    let appends = (0..40).map(|i| {
        let s = &s;
        let user = format!("user-{i}");
        let event = sign_up((i % 2 == 0).then_some(user.as_str()), &url(&user));
        async move {
            let (status, out) = append_users(s, json!([event])).await;
            (i, status, out)
        }
    });
    let answers = futures_util::future::join_all(appends).await;
    for (i, status, out) in &answers {
        let expected = if i % 2 == 0 { 200 } else { 422 };
        assert_eq!(*status, expected, "append {i}: {out}");
    }
    assert_eq!(head(&s, USERS).await, before + 20);
    let effects = reactor_effects(&s, "welcome.v1").await;
    for (i, _, out) in answers.iter().filter(|(i, _, _)| i % 2 == 0) {
        let e = &effects[&format!("welcome:user-{i}")];
        assert_eq!(e["checkpointOffset"], out["events"][0]["offset"], "{e}");
    }
    assert_eq!(effects.len(), 21, "ada and the twenty good sign-ups");
    assert_eq!(
        s.metric("streamhost_reactor_calls_total{outcome=\"refused\"}")
            .await,
        21,
        "the refused batch and the twenty refused sign-ups"
    );
    assert!(
        s.metric("streamhost_reactor_calls_total{outcome=\"ok\"}")
            .await
            >= 22,
        "ada twice and the twenty good sign-ups"
    );
    wait_for("every welcome", Duration::from_secs(30), async || {
        r.posts.lock().unwrap().len() >= 21
    })
    .await;
}

#[tokio::test]
async fn backfill_reruns_one_reactor_over_history_and_creates_nothing_the_second_time() {
    let r = Receiver::start().await;
    let s = Server::start_with(Some(EFFECTS), &[]);
    deploy(&s, "welcome", "welcome").await;
    let url = |user: &str| format!("{}/ok/welcome/{user}", r.base);
    // History from before the reactor: three sign-ups and another event.
    let (status, out) = append_users(
        &s,
        json!([sign_up(Some("a"), &url("a")), sign_up(Some("b"), &url("b")),
            {"type": "user-renamed", "payload": {}}, sign_up(Some("c"), &url("c"))]),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(configure(&s, USERS, "welcome.v1").await.0, 200);
    assert!(
        reactor_effects(&s, "welcome.v1").await.is_empty(),
        "a reactor applies to events appended after it"
    );
    let head_before = head(&s, USERS).await;

    let path = format!("{USERS}:backfillReactor");
    let backfill = |body: Value| s.post(&path, body);
    let (status, done) = backfill(json!({"name": "welcome.v1", "throughOffset": 3})).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        done,
        json!({"scanned": 3, "matched": 2, "effectsCreated": 2, "effectsExisting": 0}),
        "the created event, a and b"
    );
    let (status, done) = backfill(json!({"name": "welcome.v1"})).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["matched"], 3, "{done}");
    assert_eq!(done["effectsCreated"], 1, "{done}");
    assert_eq!(done["effectsExisting"], 2, "{done}");
    let effects = reactor_effects(&s, "welcome.v1").await;
    assert_eq!(
        effects.keys().cloned().collect::<HashSet<_>>(),
        HashSet::from(["welcome:a".into(), "welcome:b".into(), "welcome:c".into()])
    );
    assert_eq!(
        head(&s, USERS).await,
        head_before,
        "a backfill appends nothing"
    );
    wait_for(
        "the backfilled welcomes",
        Duration::from_secs(30),
        async || r.posts.lock().unwrap().len() == 3,
    )
    .await;

    assert_error(
        &backfill(json!({"name": "welcome.v9"})).await,
        404,
        "reactor-not-found",
        "welcome.v9",
    );
    assert_error(
        &backfill(json!({"name": "welcome.v1", "jsonataCondition": "$$$("})).await,
        400,
        "invalid-jsonata",
        "jsonataCondition",
    );
}

#[tokio::test]
async fn under_sigkill_every_acknowledged_sign_up_has_exactly_its_effect_and_no_effect_lacks_its_event(
) {
    const USERS_N: usize = 150;
    const KILLS: usize = 3;
    let r = Receiver::start().await;
    let mut s = Server::start_with(Some(EFFECTS), &[]);
    deploy(&s, "welcome", "welcome").await;
    assert_eq!(configure(&s, USERS, "welcome.v1").await.0, 200);
    let url = Arc::new(RwLock::new(s.url.clone()));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let acknowledged: Arc<std::sync::Mutex<Vec<(String, u64)>>> = Arc::default();
    let appender = {
        let (url, client, base, acked) = (
            url.clone(),
            client.clone(),
            r.base.clone(),
            acknowledged.clone(),
        );
        tokio::spawn(async move {
            for i in 0..USERS_N {
                let user = format!("u{i}");
                let mut event = sign_up(Some(&user), &format!("{base}/ok/welcome/{user}"));
                event["idempotencyKey"] = json!(format!("sign-up-{i}"));
                let out = post_until_ok(
                    &client,
                    &url,
                    &format!("{USERS}:append"),
                    &json!({"events": [event]}),
                )
                .await;
                let offset = out["events"][0]["offset"].as_u64().unwrap();
                acked.lock().unwrap().push((user, offset));
            }
        })
    };
    for k in 0..KILLS {
        let seen = acknowledged.lock().unwrap().len();
        wait_for(
            "sign-ups before the kill",
            Duration::from_secs(60),
            async || acknowledged.lock().unwrap().len() > seen + 20 || appender.is_finished(),
        )
        .await;
        s.restart();
        *url.write().unwrap() = s.url.clone();
        eprintln!("kill {} done", k + 1);
    }
    appender.await.unwrap();
    // The log: each user's sign-up once (the key collapses retries).
    let events = s.all_events(USERS).await;
    let signed_up: HashMap<String, u64> = events
        .iter()
        .filter(|e| e["type"] == "user-signed-up")
        .map(|e| {
            (
                e["payload"]["userId"].as_str().unwrap().to_string(),
                e["offset"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(signed_up.len(), USERS_N, "every sign-up committed once");
    for (user, offset) in acknowledged.lock().unwrap().iter() {
        assert_eq!(signed_up.get(user), Some(offset), "{user} as acknowledged");
    }
    // The outbox: exactly one effect per committed sign-up, at its offset,
    // and none without its event.
    let effects = reactor_effects(&s, "welcome.v1").await;
    assert_eq!(effects.len(), USERS_N);
    for (user, offset) in &signed_up {
        let e = &effects[&format!("welcome:{user}")];
        assert_eq!(e["checkpointOffset"], *offset, "{e}");
    }
    wait_for(
        "every welcome to be sent",
        Duration::from_secs(120),
        async || {
            reactor_effects(&s, "welcome.v1")
                .await
                .values()
                .all(|e| e["status"] == "succeeded")
        },
    )
    .await;
    let posted: HashSet<String> = r
        .posts
        .lock()
        .unwrap()
        .iter()
        .map(|p| p.body["userId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(posted, signed_up.keys().cloned().collect::<HashSet<_>>());
}

#[tokio::test]
async fn a_reactor_sees_the_events_clock_and_seed_so_a_backfill_creates_the_live_effects_again() {
    const C: &str = "/v1/projects/acme/streams/c";
    let s = Server::start_with(Some(EFFECTS), &[]);
    deploy(&s, "clocky", "clocky").await;
    let clocky = |name: &str| {
        json!({"events": [{"type": CONFIGURED, "payload": {"subscriptionKey": name,
            "filter": {"eventTypes": ["x.y/tick"]},
            "receiver": {"action": "reactor", "expression": ["components", ["get", "clocky"], "react"]}}}]})
    };
    assert_eq!(
        s.post(&format!("{C}:append"), clocky("clocky.v1")).await.0,
        200
    );
    let mut created = HashMap::new();
    for _ in 0..3 {
        let (status, out) = s
            .post(
                &format!("{C}:append"),
                json!({"events": [{"type": "x.y/tick"}, {"type": "x.y/tick"}]}),
            )
            .await;
        assert_eq!(status, 200, "{out}");
        for e in out["events"].as_array().unwrap() {
            let at = chrono::DateTime::parse_from_rfc3339(e["createdAt"].as_str().unwrap())
                .unwrap()
                .timestamp_millis();
            created.insert(e["offset"].as_u64().unwrap(), at);
        }
    }
    let payloads = |effects: HashMap<String, Value>| -> HashMap<String, Value> {
        effects
            .into_iter()
            .map(|(k, e)| (k, e["target"]["append"]["payload"].clone()))
            .collect()
    };
    let live = payloads(reactor_effects(&s, "clocky.v1").await);
    assert_eq!(live.len(), 6);
    for (offset, at) in &created {
        let p = &live[&format!("seen-{offset}")];
        assert_eq!(
            p["clockMs"], *at,
            "the clock reads the event's createdAt: {p}"
        );
        assert_eq!(p["counter"], 1, "a fresh instance per call: {p}");
    }
    let rands: HashSet<String> = live.values().map(|p| p["rand"].to_string()).collect();
    assert_eq!(rands.len(), 6, "each event its own seed: {live:?}");

    // Another reactor of the same component, backfilled over the same
    // events, sees exactly what the live one saw.
    assert_eq!(
        s.post(&format!("{C}:append"), clocky("clocky.v2")).await.0,
        200
    );
    let (status, done) = s
        .post(
            &format!("{C}:backfillReactor"),
            json!({"name": "clocky.v2"}),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["effectsCreated"], 6, "{done}");
    assert_eq!(payloads(reactor_effects(&s, "clocky.v2").await), live);
}

#[tokio::test]
async fn a_reactor_that_cannot_run_for_now_refuses_retryably_and_one_that_refuses_for_good_does_not(
) {
    let s = Server::start();
    let (status, out) = configure(&s, USERS, "welcome.v1").await;
    assert_eq!(status, 200, "{out}");
    let r = Receiver::start().await;
    let url = format!("{}/ok/welcome", r.base);
    // Not deployed yet: a later try may pass.
    let before = head(&s, USERS).await;
    let answer = reqwest::Client::new()
        .post(format!("{}{USERS}:append", s.url))
        .json(&json!({"events": [sign_up(Some("ada"), &url)]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 503);
    assert_eq!(answer.headers()["retry-after"], "1");
    let body: Value = answer.json().await.unwrap();
    let unavailable = (503, body);
    assert_error(&unavailable, 503, "reactor-unavailable", "is not deployed");
    assert_eq!(
        unavailable.1["error"]["retryable"], true,
        "{}",
        unavailable.1
    );
    assert_eq!(
        unavailable.1["error"]["reactor"], "welcome.v1",
        "{}",
        unavailable.1
    );
    assert_eq!(head(&s, USERS).await, before, "nothing committed");

    deploy(&s, "welcome", "welcome").await;
    // The reactor's own retryable err.
    let mut later = sign_up(Some("bob"), &url);
    later["payload"]["email"] = json!("later@example.com");
    let refused = append_users(&s, json!([later])).await;
    assert_error(
        &refused,
        503,
        "reactor-unavailable",
        "the mail system is down",
    );
    assert_eq!(refused.1["error"]["retryable"], true, "{}", refused.1);
    // Its err marked not retryable: final.
    let refused = append_users(&s, json!([sign_up(None, &url)])).await;
    assert_error(&refused, 422, "reactor-failed", "has no userId");
    assert_eq!(refused.1["error"]["retryable"], false, "{}", refused.1);
    assert_eq!(refused.1["error"]["reactor"], "welcome.v1", "{}", refused.1);
    let message = refused.1["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("reactor \"welcome.v1\" (component \"welcome\") refused"),
        "{message}"
    );
    assert_eq!(head(&s, USERS).await, before, "nothing committed");
    // Deployed, the first append goes through.
    let (status, out) = append_users(&s, json!([sign_up(Some("ada"), &url)])).await;
    assert_eq!(status, 200, "{out}");
}

#[tokio::test]
async fn events_ingested_before_their_reactor_is_deployed_are_appended_once_it_is() {
    let s = Server::start();
    let (status, out) = configure(&s, USERS, "welcome.v1").await;
    assert_eq!(status, 200, "{out}");
    let r = Receiver::start().await;
    let url = format!("{}/ok/welcome", r.base);
    let users: Vec<String> = (0..5).map(|i| format!("user-{i}")).collect();
    for user in &users {
        let mut event = sign_up(Some(user), &url);
        event["idempotencyKey"] = json!(format!("sign-up-{user}"));
        let (status, out) = s
            .post(
                "/v1/projects/acme/ingest/users",
                json!({ "events": [event] }),
            )
            .await;
        assert_eq!(status, 202, "{out}");
    }
    // Refused for now while the component is missing: held, in order, and
    // shown as blocked with why.
    wait_for(
        "the stream's ingest to show as blocked",
        Duration::from_secs(30),
        async || {
            s.get("/v1/ingest").await.1["http"]["blocked"]
                .as_array()
                .is_some_and(|b| !b.is_empty())
        },
    )
    .await;
    let (_, ingest) = s.get("/v1/ingest").await;
    assert_eq!(ingest["http"]["pending"], 5, "{ingest}");
    let blocked = &ingest["http"]["blocked"][0];
    assert_eq!(blocked["path"], "/users", "{ingest}");
    assert!(
        blocked["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("welcome.v1") && e.contains("is not deployed")),
        "{ingest}"
    );
    assert_eq!(
        ingest["http"]["drops"],
        json!([]),
        "nothing dropped: {ingest}"
    );
    assert_eq!(s.metric("streamhost_ingest_blocked_streams").await, 1);
    deploy(&s, "welcome", "welcome").await;
    wait_for(
        "the five sign-ups to be appended",
        Duration::from_secs(30),
        async || {
            s.all_events(USERS)
                .await
                .iter()
                .filter(|e| e["type"] == "user-signed-up")
                .count()
                == 5
        },
    )
    .await;
    let appended: Vec<String> = s
        .all_events(USERS)
        .await
        .iter()
        .filter(|e| e["type"] == "user-signed-up")
        .map(|e| e["payload"]["userId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(appended, users, "every accepted event, once, in order");
    let effects = reactor_effects(&s, "welcome.v1").await;
    assert_eq!(effects.len(), 5, "{effects:?}");
    // An event's pending row goes in the write after its append commits.
    let mut ingest = Value::Null;
    wait_for(
        "the appended events' pending rows to go",
        Duration::from_secs(30),
        async || {
            ingest = s.get("/v1/ingest").await.1;
            ingest["http"]["pending"] == 0
        },
    )
    .await;
    assert_eq!(ingest["http"]["blocked"], json!([]), "{ingest}");
}

#[tokio::test]
async fn a_copy_a_reactor_refuses_for_good_halts_at_once_and_one_refused_for_now_waits() {
    // Retries enough to outlast a deploy (a refusal for now is retried
    // like any failure that may heal, then halts).
    const PATIENT: &str = "[delivery]\nmax-attempts = 50\nbackoff-base-ms = 20\nbackoff-max-ms = 200\ntimeout-ms = 5000\n";
    let s = Server::start_with(Some(PATIENT), &[]);
    let r = Receiver::start().await;
    let url = format!("{}/ok/welcome", r.base);
    let (status, out) = configure(&s, USERS, "welcome.v1").await;
    assert_eq!(status, 200, "{out}");
    let copy = |key: &str| {
        json!({"events": [{"type": CONFIGURED, "payload": {
            "subscriptionKey": key, "filter": {"eventTypes": ["user-signed-up"]},
            "receiver": {"action": "copy-to-stream", "receivingStreamPath": "/users",
                "delivery": {"start": "now", "onFailingEvent": "halt"}}}}]})
    };
    // Not deployed yet: the copy waits (retried), then lands once it is.
    let early = "/v1/projects/acme/streams/early";
    s.post(&format!("{early}:append"), copy("to-users")).await;
    let (status, out) = s
        .post(
            &format!("{early}:append"),
            json!({"events": [sign_up(Some("ada"), &url)]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    wait_for(
        "the copy to meet the missing reactor",
        Duration::from_secs(20),
        async || {
            s.get(&format!("{early}:runtime")).await.1["subscriptions"]["to-users"]["lastError"]
                .as_str()
                .is_some_and(|e| e.contains("is not deployed"))
        },
    )
    .await;
    deploy(&s, "welcome", "welcome").await;
    s.wait_acknowledged(early, "to-users", 3, "the copy after the deploy")
        .await;
    let (_, rt) = s.get(&format!("{early}:runtime")).await;
    assert_eq!(rt["subscriptions"]["to-users"]["halted"], false, "{rt}");

    // Refused for good: halted at once, naming the reactor.
    let late = "/v1/projects/acme/streams/late";
    s.post(&format!("{late}:append"), copy("to-users")).await;
    let (status, out) = s
        .post(
            &format!("{late}:append"),
            json!({"events": [sign_up(None, &url)]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let halted = s
        .wait_halted(late, "to-users", Duration::from_secs(20))
        .await;
    assert_eq!(halted["attempts"], 1, "{halted}");
    let error = halted["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("reactor \"welcome.v1\" (component \"welcome\") refused")
            && error.contains("has no userId"),
        "{halted}"
    );
}

/// The parked events of project acme, as its own token sees them.
async fn parked(s: &Server) -> Vec<Value> {
    let (status, page) = s
        .get_as(Some("t-acme"), "/v1/projects/acme/ingest/parked")
        .await;
    assert_eq!(status, 200, "{page}");
    page["parked"].as_array().expect("parked").clone()
}

/// Ingests one sign-up to the users stream as project acme.
async fn ingest_sign_up(s: &Server, user: Option<&str>, key: &str, url: &str) -> (u16, Value) {
    let mut event = sign_up(user, url);
    event["idempotencyKey"] = json!(key);
    s.post_as(
        Some("t-acme"),
        "/v1/projects/acme/ingest/users",
        json!({ "events": [event] }),
    )
    .await
}

/// The user ids signed up on the users stream, in order.
async fn signed_up(s: &Server) -> Vec<String> {
    s.all_events(USERS)
        .await
        .iter()
        .filter(|e| e["type"] == "user-signed-up")
        .map(|e| e["payload"]["userId"].as_str().unwrap_or("?").to_string())
        .collect()
}

#[tokio::test]
async fn an_ingested_event_a_reactor_refuses_for_good_is_parked_for_its_project_to_redrive_or_discard(
) {
    let config = format!(
        "{}\n[ingest]\nmax-pending-events-per-project = 3\n",
        crate::support::TOKENS
    );
    let mut s = Server::start_with(Some(&config), &[]);
    s.token = Some("t-admin".into());
    let (status, out) = configure(&s, USERS, "welcome.v1").await;
    assert_eq!(status, 200, "{out}");
    deploy(&s, "welcome", "welcome").await;
    let r = Receiver::start().await;
    let url = format!("{}/ok/welcome", r.base);
    for (user, key) in [
        (Some("ada"), "k-ada"),
        (None, "k-bad-1"),
        (Some("bob"), "k-bob"),
    ] {
        let (status, out) = ingest_sign_up(&s, user, key, &url).await;
        assert_eq!(status, 202, "{out}");
    }
    // The refused one is parked; the ones behind it go on, in order.
    wait_for(
        "ada and bob signed up",
        Duration::from_secs(30),
        async || signed_up(&s).await.len() == 2,
    )
    .await;
    assert_eq!(signed_up(&s).await, ["ada", "bob"]);
    let p = parked(&s).await;
    assert_eq!(p.len(), 1, "{p:?}");
    let first = &p[0];
    assert_eq!(
        (&first["path"], &first["source"]),
        (&json!("/users"), &json!("http"))
    );
    assert_eq!(first["event"]["idempotencyKey"], "k-bad-1", "{first}");
    assert_eq!(first["event"]["type"], "user-signed-up", "{first}");
    let reason = first["reason"].as_str().unwrap();
    assert!(
        reason.contains("welcome.v1") && reason.contains("has no userId"),
        "{reason}"
    );
    assert!(
        first["acceptedAt"].as_str().unwrap().ends_with('Z'),
        "{first}"
    );
    assert!(
        first["parkedAt"].as_str().unwrap().ends_with('Z'),
        "{first}"
    );
    let bad_1 = first["id"].as_i64().unwrap();
    // Only a caller of the project sees them.
    let (status, _) = s.get_as(None, "/v1/projects/acme/ingest/parked").await;
    assert_eq!(status, 401);

    // Parked events keep their capacity: with three parked, the project's
    // share (3) is full and nothing was dropped to make room.
    for key in ["k-bad-2", "k-bad-3"] {
        let (status, out) = ingest_sign_up(&s, None, key, &url).await;
        assert_eq!(status, 202, "{out}");
    }
    wait_for("three parked", Duration::from_secs(30), async || {
        parked(&s).await.len() == 3
    })
    .await;
    let full = ingest_sign_up(&s, Some("carl"), "k-carl", &url).await;
    assert_error(&full, 503, "capacity-exhausted", "project \"acme\"");
    let (_, status) = s.get("/v1/ingest").await;
    assert_eq!(
        (&status["http"]["parked"], &status["http"]["pending"]),
        (&json!(3), &json!(0)),
        "{status}"
    );
    assert_eq!(
        s.metric("streamhost_ingest_parked_events{project=\"acme\"}")
            .await,
        3
    );

    // Redriven while the reactor still refuses: the append's refusal, and
    // it stays parked.
    let again = s
        .post_as(
            Some("t-acme"),
            &format!("/v1/projects/acme/ingest/parked/{bad_1}:redrive"),
            json!({}),
        )
        .await;
    assert_error(&again, 422, "reactor-failed", "has no userId");
    assert_eq!(parked(&s).await.len(), 3);

    // Discarded: gone, recorded on its stream, its room given back.
    let bad_2 = parked(&s).await[1]["id"].as_i64().unwrap();
    let (status, out) = s
        .post_as(
            Some("t-acme"),
            &format!("/v1/projects/acme/ingest/parked/{bad_2}:discard"),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["discarded"]["id"], bad_2, "{out}");
    let lines: Vec<Value> = s
        .all_events(USERS)
        .await
        .into_iter()
        .filter(|e| e["type"] == "events.iterate.com/stream/error-occurred")
        .filter(|e| e["payload"]["ingest"].is_object())
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let message = lines[0]["payload"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("parked ingest event {bad_2}"))
            && message.contains("\"k-bad-2\"")
            && message.contains("has no userId"),
        "{message}"
    );
    assert_eq!(parked(&s).await.len(), 2);
    let (status, out) = ingest_sign_up(&s, Some("carl"), "k-carl", &url).await;
    assert_eq!(status, 202, "{out}");
    wait_for("carl signed up", Duration::from_secs(30), async || {
        signed_up(&s).await.len() == 3
    })
    .await;

    // Without the reactor, a redrive appends it (once: its key).
    unsubscribe(&s, USERS, "welcome.v1").await;
    let path = format!("/v1/projects/acme/ingest/parked/{bad_1}:redrive");
    let (status, out) = s.post_as(Some("t-acme"), &path, json!({})).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["events"][0]["idempotencyKey"], "k-bad-1", "{out}");
    let twice = s.post_as(Some("t-acme"), &path, json!({})).await;
    assert_error(&twice, 404, "parked-event-not-found", &format!("{bad_1}"));
    assert_eq!(signed_up(&s).await, ["ada", "bob", "carl", "?"]);
    let left: Vec<Value> = parked(&s).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["event"]["idempotencyKey"], "k-bad-3");
    assert_eq!(
        s.metric("streamhost_ingest_parked_events{project=\"acme\"}")
            .await,
        1
    );
}

/// `streamhost subscribe --reactor` configures a reactor; a component that
/// exports no reactor is refused naming what it exports.
#[tokio::test]
async fn the_cli_configures_a_reactor_and_refuses_a_component_without_one() {
    let s = Server::start();
    deploy(&s, "welcome", "welcome").await;
    deploy(&s, "kinds", "kinds").await;
    let configured = crate::support::cli_json(
        &s,
        &[
            "subscribe",
            "/users",
            "welcome.v1",
            "--reactor",
            "welcome",
            "--type",
            "user-signed-up",
        ],
    );
    let receiver = &configured["events"][0]["payload"]["receiver"];
    assert_eq!(receiver["action"], "reactor", "{configured}");
    let refused = append_users(&s, json!([sign_up(None, "http://127.0.0.1:9/")])).await;
    assert_error(
        &refused,
        422,
        "reactor-failed",
        "its err: the user-signed-up event",
    );
    let (ok, _, err) =
        crate::support::cli_with(&s, &["subscribe", "/users", "other", "--reactor", "kinds"]);
    assert!(!ok);
    assert!(
        err.contains("\"kinds\" is not a reactor: it exports"),
        "{err}"
    );
    let (ok, _, err) = crate::support::cli_with(
        &s,
        &[
            "subscribe",
            "/users",
            "other",
            "--reactor",
            "welcome",
            "--transform",
            "$",
        ],
    );
    assert!(!ok);
    assert!(err.contains("--transform does not apply"), "{err}");
}

/// Configures reactor `name` of component `component` on `stream`, for
/// the events of `types` (every event: `None`).
async fn configure_any(
    s: &Server,
    stream: &str,
    name: &str,
    component: &str,
    types: Option<&[&str]>,
) {
    let mut payload = json!({
        "subscriptionKey": name,
        "receiver": {"action": "reactor",
            "expression": ["components", ["get", component], "react"]}});
    if let Some(types) = types {
        payload["filter"] = json!({"eventTypes": types});
    }
    let (status, out) = s
        .post(
            &format!("{stream}:append"),
            json!({"events": [{"type": CONFIGURED, "payload": payload}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
}

/// Appends one event of `event_type` to `stream`: the status, the answer,
/// its `retry-after`.
async fn append_raw(s: &Server, stream: &str, event_type: &str) -> (u16, Value, Option<String>) {
    let answer = reqwest::Client::new()
        .post(format!("{}{stream}:append", s.url))
        .json(&json!({"events": [{"type": event_type, "payload": {}}]}))
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    let retry_after = answer
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (status, answer.json().await.unwrap(), retry_after)
}

#[tokio::test]
async fn a_reactor_that_times_out_again_and_again_rests_and_the_streams_other_appends_go_on() {
    let s = Server::start();
    let (status, out) = s
        .deploy("evil", "hostile", crate::support::guest("hostile"))
        .await;
    assert!(status == 200 || status == 201, "{out}");
    let stream = "/v1/projects/evil/streams/spin";
    configure_any(&s, stream, "spin", "hostile", Some(&["hostile/loop"])).await;
    let before = head(&s, stream).await;
    // Two calls in a row run to their timeout: each refuses its append.
    for _ in 0..2 {
        let (status, body, retry_after) = append_raw(&s, stream, "hostile/loop").await;
        assert_error(
            &(status, body.clone()),
            503,
            "reactor-unavailable",
            "timed out",
        );
        assert_eq!(retry_after.as_deref(), Some("1"), "{body}");
    }
    // Then it rests: refused at once, without a call, for the rest left.
    let (status, body, retry_after) = append_raw(&s, stream, "hostile/loop").await;
    assert_error(
        &(status, body.clone()),
        503,
        "reactor-unavailable",
        "its last 2 calls ran to their timeout (1000 ms each), so it is not called until",
    );
    let retry_after: u64 = retry_after.expect("a retry-after").parse().unwrap();
    assert!((1..=2).contains(&retry_after), "{retry_after} s");
    // The stream's other appends go on (none waits behind a call).
    for _ in 0..3 {
        let (status, body, _) = append_raw(&s, stream, "order/placed").await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(head(&s, stream).await, before + 3, "only the other events");
    // After its rest it is called again: another timeout.
    let mut answer = None;
    wait_for(
        "the reactor called again after its rest",
        Duration::from_secs(30),
        async || {
            let (status, body, _) = append_raw(&s, stream, "hostile/loop").await;
            let called = body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("timed out"));
            answer = Some((status, body));
            called
        },
    )
    .await;
    assert_error(&answer.unwrap(), 503, "reactor-unavailable", "timed out");
}

#[tokio::test]
async fn a_projects_reactors_take_places_of_its_call_share_and_another_projects_do_not_wait() {
    let config = "[processors]\nmax-concurrent-calls = 4\nmax-concurrent-calls-per-project = 2\n\
                  [delivery]\ntimeout-ms = 30000\nmax-attempts = 50\n[effects]\nlease-ms = 300000\n";
    let s = Server::start_with(Some(config), &[]);
    for project in ["evil", "good"] {
        let (status, out) = s
            .deploy(project, "hostile", crate::support::guest("hostile"))
            .await;
        assert!(status == 200 || status == 201, "{out}");
    }
    // Evil's two places held by wakes that spin for thirty seconds.
    crate::isolation::spinning_wakes(&s, "evil", "hostile", 2).await;
    let evil = "/v1/projects/evil/streams/orders";
    let good = "/v1/projects/good/streams/orders";
    configure_any(&s, evil, "audit", "hostile", None).await;
    configure_any(&s, good, "audit", "hostile", None).await;
    let evil_filtered = "/v1/projects/evil/streams/filtered";
    configure_any(
        &s,
        evil_filtered,
        "spin",
        "hostile",
        Some(&["hostile/loop"]),
    )
    .await;
    // Evil's reactor waits for a place of its own project's, then its
    // append is refused naming the share.
    let mut refused = None;
    wait_for(
        "evil's reactor refused at its share",
        Duration::from_secs(30),
        async || {
            let (status, body, _) = append_raw(&s, evil, "order/placed").await;
            let at_share = status == 503;
            refused = Some((status, body));
            at_share
        },
    )
    .await;
    assert_error(
        &refused.unwrap(),
        503,
        "reactor-unavailable",
        "max-concurrent-calls-per-project = 2",
    );
    // Another project's reactor runs at once.
    for _ in 0..3 {
        let (status, body, _) = append_raw(&s, good, "order/placed").await;
        assert_eq!(status, 200, "good's append: {body}");
    }
    // An event no reactor runs for needs no place, evil's or not.
    let (status, body, _) = append_raw(&s, evil_filtered, "order/placed").await;
    assert_eq!(status, 200, "{body}");
}
