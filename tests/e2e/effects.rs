//! The processor outbox end to end: the `effector` guest returns the effects
//! its events ask for; the real server commits them with the checkpoint and
//! runs them against a real loopback HTTP receiver, other streams and an
//! ITX component.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::support::{assert_error, guest, post_until_ok, wait_for, Server};

pub const EFFECTS: &str = r#"
[delivery]
max-attempts = 3
backoff-base-ms = 10
backoff-max-ms = 40
timeout-ms = 1000

[effects]
max-attempts = 3
lease-ms = 1500
concurrency = 8
"#;

const SRC: &str = "/v1/projects/acme/streams/orders";
const FX: &str = "/v1/projects/acme/effects";

/// One POST the receiver got.
#[derive(Debug, Clone)]
pub struct Post {
    pub path: String,
    pub key: Option<String>,
    /// Its `streamhost-effect-*` headers (the effect's envelope).
    pub envelope: HashMap<String, String>,
    /// Its `traceparent` header.
    pub traceparent: Option<String>,
    pub body: Value,
}

/// A loopback receiver: `/ok/*` answers 200, `/gone/*` 404, `/busy/*` 503,
/// `/hang/*` not for ten minutes.
pub struct Receiver {
    pub base: String,
    pub posts: Arc<Mutex<Vec<Post>>>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let posts: Arc<Mutex<Vec<Post>>> = Arc::default();
        async fn hook(
            State(posts): State<Arc<Mutex<Vec<Post>>>>,
            Path((kind, rest)): Path<(String, String)>,
            headers: HeaderMap,
            Json(body): Json<Value>,
        ) -> StatusCode {
            let key = headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let envelope = headers
                .iter()
                .filter(|(name, _)| name.as_str().starts_with("streamhost-effect-"))
                .map(|(name, v)| (name.to_string(), v.to_str().unwrap_or("").to_string()))
                .collect();
            let traceparent = headers
                .get("traceparent")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            posts.lock().unwrap().push(Post {
                path: format!("/{kind}/{rest}"),
                key,
                envelope,
                traceparent,
                body,
            });
            match kind.as_str() {
                "ok" => StatusCode::OK,
                "gone" => StatusCode::NOT_FOUND,
                "hang" => {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    StatusCode::OK
                }
                _ => StatusCode::SERVICE_UNAVAILABLE,
            }
        }
        let app = Router::new()
            .route("/{kind}/{*rest}", post(hook))
            .with_state(posts.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver { base, posts }
    }

    pub fn posts_to(&self, path: &str) -> Vec<Post> {
        let posts = self.posts.lock().unwrap();
        posts.iter().filter(|p| p.path == path).cloned().collect()
    }
}

/// Deploys the effector and wakes it on `stream` (an API path).
pub async fn effector_on(s: &Server, stream: &str) {
    deploy(s, "effector", "effector").await;
    wake(s, stream, "fx", "effector").await;
}

/// Deploys the guest `guest_name` as component `name`; answers the deploy.
pub async fn deploy(s: &Server, name: &str, guest_name: &str) -> Value {
    let (status, out) = s.deploy("acme", name, guest(guest_name)).await;
    assert_eq!(status, 200, "{out}");
    out
}

/// Wakes processor `component` on `stream` with subscription `key`.
pub async fn wake(s: &Server, stream: &str, key: &str, component: &str) {
    let (status, out) = s
        .post(
            &format!("{stream}:append"),
            json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": key, "receiver": {"action": "processor-wake",
                    "expression": ["components", ["get", component], "wake"]}}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
}

/// Three requests on the source, each for one append effect `k0`..`k2` of
/// `event_type` to `/out`.
async fn three_requests(s: &Server, event_type: &str) {
    for i in 0..3 {
        request(
            s,
            SRC,
            json!([{"key": format!("k{i}"), "append": {"streamPath": "/out", "type": event_type, "payload": {"i": i}}}]),
        )
        .await;
    }
}

/// Appends one `effects-requested` event asking for `effects`.
pub async fn request(s: &Server, stream: &str, effects: Value) -> u64 {
    let (status, out) = s
        .post(
            &format!("{stream}:append"),
            json!({"events": [{"type": "events.example/effects-requested",
                "payload": {"effects": effects}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    out["events"][0]["offset"].as_u64().unwrap()
}

/// Every effect of the project, following pages.
pub async fn all_effects(s: &Server, filter: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let (status, page) = s
            .get(&format!("{FX}?afterId={after}&limit=2{filter}"))
            .await;
        assert_eq!(status, 200, "{page}");
        out.extend(page["effects"].as_array().unwrap().iter().cloned());
        match page["nextAfterId"].as_i64() {
            Some(next) => after = next,
            None => return out,
        }
    }
}

/// Waits until the effect with `key` has `status`; returns it.
pub async fn settled(s: &Server, key: &str, status: &str) -> Value {
    let find = async || {
        all_effects(s, "")
            .await
            .into_iter()
            .find(|e| e["key"] == key)
    };
    let mut seen = None;
    wait_for(
        &format!("effect {key:?} to be {status}"),
        Duration::from_secs(30),
        async || {
            seen = find().await.filter(|e| e["status"] == status);
            seen.is_some()
        },
    )
    .await;
    seen.expect("found")
}

fn error_lines(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["type"] == "events.iterate.com/stream/error-occurred")
        .cloned()
        .collect()
}

#[tokio::test]
async fn append_effects_run_once_after_the_commit_and_repeated_identities_are_ignored() {
    let s = Server::start_with(Some(EFFECTS), &[]);
    effector_on(&s, SRC).await;
    let first = request(
        &s,
        SRC,
        json!([{"key": "a", "append": {"streamPath": "/out", "type": "x.y/done", "payload": {"n": 1}}},
               {"key": "b", "append": {"streamPath": "/out", "type": "x.y/done", "payload": {"n": 2}}}]),
    )
    .await;
    // The same identity again, with another payload: ignored.
    request(
        &s,
        SRC,
        json!([{"key": "a", "append": {"streamPath": "/out", "type": "x.y/done", "payload": {"n": 99}}}]),
    )
    .await;
    let a = settled(&s, "a", "succeeded").await;
    settled(&s, "b", "succeeded").await;
    assert_eq!(a["attempts"], 1, "{a}");
    assert_eq!(a["component"], "effector");
    assert_eq!(a["stream"], "/orders");
    // The checkpoint of the batch that returned it: the event's, or a
    // later one when the second event was folded in the same batch.
    let checkpoint = a["checkpointOffset"].as_u64().unwrap();
    assert!((first..=first + 1).contains(&checkpoint), "{a}");
    assert_eq!(a["target"]["append"]["payload"], json!({"n": 1}));
    assert!(
        a["settledAt"].is_string() && a["nextAttemptAt"].is_null(),
        "{a}"
    );
    assert_eq!(all_effects(&s, "").await.len(), 2);
    assert_eq!(
        s.metric("streamhost_effect_executions_total{outcome=\"succeeded\"}")
            .await,
        2
    );

    let out = s.all_events("/v1/projects/acme/streams/out").await;
    let done: Vec<&Value> = out.iter().filter(|e| e["type"] == "x.y/done").collect();
    assert_eq!(done.len(), 2, "{out:?}");
    let a_event = done
        .iter()
        .find(|e| e["idempotencyKey"] == "effect:effector:/orders:a")
        .expect("the event of effect \"a\"");
    assert_eq!(a_event["payload"], json!({"n": 1}));
    let origin = &a_event["source"]["effect"];
    assert_eq!(origin["path"], "/orders");
    assert_eq!(origin["component"], "effector");
    assert_eq!(origin["key"], "a");
    assert_eq!(origin["checkpointOffset"], checkpoint);
    let (_, state) = s.get(&format!("{SRC}:state")).await;
    assert_eq!(origin["streamId"], state["streamId"]);

    // source.effect is platform-authored.
    let forged = s
        .post(
            "/v1/projects/acme/streams/out:append",
            json!({"events": [{"type": "x.y/done", "source": {"effect": origin}}]}),
        )
        .await;
    assert_error(&forged, 403, "platform-authored", "source.effect");

    // Filters and one effect by id.
    let by_stream = all_effects(&s, "&stream=/orders&component=effector&status=succeeded").await;
    assert_eq!(by_stream.len(), 2);
    assert!(all_effects(&s, "&status=failed").await.is_empty());
    let (status, one) = s.get(&format!("{FX}/{}", a["id"])).await;
    assert_eq!((status, &one), (200, &a));
    assert_error(
        &s.get(&format!("{FX}/999999")).await,
        404,
        "effect-not-found",
        "999999",
    );
    assert_error(
        &s.get(&format!("{FX}?status=done")).await,
        400,
        "invalid-request",
        "\"done\"",
    );
}

/// An append effect settles in the transaction that commits its event:
/// no reader (here the database itself, one statement a snapshot) ever
/// sees an effect's event stored while its effect is still running.
#[tokio::test]
async fn an_append_effects_event_and_its_settlement_commit_together() {
    let s = Server::start_with(Some(EFFECTS), &[]);
    effector_on(&s, SRC).await;
    const N: i64 = 40;
    let effects: Vec<Value> = (0..N)
        .map(|i| json!({"key": format!("t{i}"), "append": {"streamPath": "/out", "type": "x.y/done", "payload": {"i": i}}}))
        .collect();
    // Two requests, so that some effects run while others are appended.
    request(&s, SRC, Value::Array(effects[..N as usize / 2].to_vec())).await;
    request(&s, SRC, Value::Array(effects[N as usize / 2..].to_vec())).await;
    let db = s.db();
    // The effect events in /out, and those of them whose effect is not
    // settled, each counted in one snapshot of the database.
    let from = "FROM events e JOIN streams st ON e.stream = st.id
         JOIN effects f ON e.idempotency_key = 'effect:' || f.component || ':' || f.path || ':' || f.effect_key
         WHERE st.path = '/out'";
    let stored = format!("SELECT count(*) {from}");
    let unsettled = format!("SELECT count(*) {from} AND f.status <> 'succeeded'");
    let mut looks = 0;
    wait_for(
        "every effect's event stored",
        Duration::from_secs(30),
        async || {
            looks += 1;
            assert_eq!(
                db.query_i64(&unsettled),
                Some(0),
                "an effect's event was stored before its effect settled"
            );
            db.query_i64(&stored) == Some(N)
        },
    )
    .await;
    assert!(
        looks > 1,
        "the effects ran before the first look: nothing was checked"
    );
    for i in 0..N {
        let e = settled(&s, &format!("t{i}"), "succeeded").await;
        assert_eq!(e["attempts"], 1, "{e}");
        assert!(e["settledAt"].is_string(), "{e}");
    }
    assert_eq!(
        s.metric("streamhost_effect_executions_total{outcome=\"succeeded\"}")
            .await,
        N as u64
    );
}

#[tokio::test]
async fn webhook_effects_carry_their_id_and_a_4xx_fails_at_once_with_one_error_line() {
    let r = Receiver::start().await;
    let s = Server::start_with(Some(EFFECTS), &[]);
    effector_on(&s, SRC).await;
    request(
        &s,
        SRC,
        json!([{"key": "ok", "webhook": {"url": format!("{}/ok/1", r.base), "body": {"hello": 1}}},
               {"key": "gone", "webhook": {"url": format!("{}/gone/1", r.base), "body": {}}},
               {"key": "busy", "webhook": {"url": format!("{}/busy/1", r.base), "body": {}}}]),
    )
    .await;
    let ok = settled(&s, "ok", "succeeded").await;
    let posts = r.posts_to("/ok/1");
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].key.as_deref(), Some(ok["id"].to_string().as_str()));
    assert_eq!(posts[0].body, json!({"hello": 1}));
    // Its envelope: who produced it, and its key (a processor's effects
    // have no type or metadata).
    assert_eq!(
        posts[0].envelope,
        HashMap::from([
            (
                "streamhost-effect-consumer".to_string(),
                "processor:effector".to_string()
            ),
            ("streamhost-effect-key".to_string(), "ok".to_string()),
        ])
    );
    assert_eq!(
        (&ok["consumer"], &ok["consumerKind"]),
        (&json!("effector"), &json!("processor"))
    );

    let gone = settled(&s, "gone", "failed").await;
    assert_eq!(gone["attempts"], 1, "a 404 is not retried: {gone}");
    assert!(
        gone["lastError"].as_str().unwrap().contains("404"),
        "{gone}"
    );
    assert_eq!(r.posts_to("/gone/1").len(), 1);
    let busy = settled(&s, "busy", "failed").await;
    assert_eq!(
        busy["attempts"], 3,
        "a 503 is retried up to max-attempts: {busy}"
    );
    assert_eq!(r.posts_to("/busy/1").len(), 3);
    // /metrics counts the outbox by status: both failed, nothing pending.
    assert_eq!(s.metric("streamhost_effects{status=\"failed\"}").await, 2);
    assert_eq!(s.metric("streamhost_effects{status=\"pending\"}").await, 0);

    let lines = error_lines(&s.all_events(SRC).await);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let gone_line = lines
        .iter()
        .find(|l| l["payload"]["effect"]["key"] == "gone")
        .expect("the line of \"gone\"");
    assert_eq!(
        gone_line["payload"]["effect"],
        json!({"id": gone["id"], "component": "effector", "key": "gone"})
    );
    let message = gone_line["payload"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "effect \"gone\" of processor \"effector\" failed after 1 attempt(s): webhook responded 404"
        ),
        "{message}"
    );

    // :retry runs a failed effect again (attempts reset); it fails again
    // and says so in a second line.
    let (status, retried) = s
        .post(&format!("{FX}/{}:retry", gone["id"]), json!({}))
        .await;
    assert_eq!(status, 200, "{retried}");
    assert_eq!(retried["attempts"], 0);
    wait_for(
        "the retried effect to run",
        Duration::from_secs(30),
        async || r.posts_to("/gone/1").len() == 2,
    )
    .await;
    settled(&s, "gone", "failed").await;
    wait_for("a second error line", Duration::from_secs(30), async || {
        error_lines(&s.all_events(SRC).await).len() == 3
    })
    .await;

    // Conflicts.
    assert_error(
        &s.post(&format!("{FX}/{}:retry", ok["id"]), json!({})).await,
        409,
        "effect-not-retryable",
        "succeeded",
    );
    assert_error(
        &s.post(&format!("{FX}/{}:cancel", ok["id"]), json!({}))
            .await,
        409,
        "effect-not-cancellable",
        "succeeded",
    );
    let (status, cancelled) = s
        .post(&format!("{FX}/{}:cancel", busy["id"]), json!({}))
        .await;
    assert_eq!((status, &cancelled["status"]), (200, &json!("cancelled")));
    assert_error(
        &s.post(&format!("{FX}/{}:cancel", busy["id"]), json!({}))
            .await,
        409,
        "effect-not-cancellable",
        "cancelled",
    );
    assert_error(
        &s.post(&format!("{FX}/{}:explode", busy["id"]), json!({}))
            .await,
        404,
        "method-not-found",
        "explode",
    );
}

#[tokio::test]
async fn a_pending_effect_can_be_cancelled_and_a_cancelled_one_retried_at_once() {
    let r = Receiver::start().await;
    // A long backoff keeps the failed first attempt's effect pending.
    let config = EFFECTS
        .replace("backoff-base-ms = 10", "backoff-base-ms = 60000")
        .replace("backoff-max-ms = 40", "backoff-max-ms = 60000");
    let s = Server::start_with(Some(&config), &[]);
    effector_on(&s, SRC).await;
    request(
        &s,
        SRC,
        json!([{"key": "later", "webhook": {"url": format!("{}/busy/2", r.base), "body": {}}}]),
    )
    .await;
    // Pending again after its first attempt (not yet leased is pending too).
    let after_one = async || {
        all_effects(&s, "")
            .await
            .into_iter()
            .find(|e| e["key"] == "later" && e["status"] == "pending" && e["attempts"] == 1)
    };
    wait_for(
        "a failed first attempt",
        Duration::from_secs(30),
        async || after_one().await.is_some(),
    )
    .await;
    let pending = after_one().await.unwrap();
    assert!(pending["nextAttemptAt"].is_string(), "{pending}");
    let (status, cancelled) = s
        .post(&format!("{FX}/{}:cancel", pending["id"]), json!({}))
        .await;
    assert_eq!((status, &cancelled["status"]), (200, &json!("cancelled")));
    let (status, again) = s
        .post(&format!("{FX}/{}:retry", pending["id"]), json!({}))
        .await;
    assert_eq!((status, &again["status"]), (200, &json!("pending")));
    // Pending, or already running again: either way not retryable.
    assert_error(
        &s.post(&format!("{FX}/{}:retry", pending["id"]), json!({}))
            .await,
        409,
        "effect-not-retryable",
        &format!("effect {} is ", pending["id"]),
    );
    // The retry runs at once, despite the long backoff.
    wait_for(
        "the retried effect to run",
        Duration::from_secs(30),
        async || r.posts_to("/busy/2").len() == 2,
    )
    .await;
}

#[tokio::test]
async fn itx_effects_keep_their_result_and_bad_effects_fail_the_fold() {
    let s = Server::start_with(Some(EFFECTS), &[]);
    let (status, out) = s.deploy("acme", "kinds", guest("kinds")).await;
    assert_eq!(status, 200, "{out}");
    effector_on(&s, SRC).await;
    request(
        &s,
        SRC,
        json!([{"key": "sum", "itx": {"expression": ["components", ["get", "kinds"], "add"], "args": [2, 3]}}]),
    )
    .await;
    let sum = settled(&s, "sum", "succeeded").await;
    assert_eq!(sum["result"], 5, "{sum}");
    assert_eq!(
        sum["target"]["itx"]["expression"],
        json!(["components", ["get", "kinds"], "add"])
    );

    // An effect the host cannot run fails the fold, naming it.
    request(
        &s,
        SRC,
        json!([{"key": "bad", "append": {"streamPath": "/has space", "type": "x.y/z"}}]),
    )
    .await;
    let halted = s.wait_halted(SRC, "fx", Duration::from_secs(30)).await;
    let text = halted.to_string();
    assert!(
        text.contains("returned a bad effect: effects[0].stream-path")
            && text.contains("/has space"),
        "{halted}"
    );
    assert!(all_effects(&s, "").await.iter().all(|e| e["key"] != "bad"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_sigkill_every_effect_of_every_acknowledged_event_runs_and_none_twice() {
    const ORDERS: usize = 120;
    const KILLS: usize = 3;
    let r = Receiver::start().await;
    let mut s = Server::start_with(Some(EFFECTS), &[]);
    effector_on(&s, SRC).await;
    let url = Arc::new(RwLock::new(s.url.clone()));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let appender = {
        let (url, client, base) = (url.clone(), client.clone(), r.base.clone());
        tokio::spawn(async move {
            for i in 0..ORDERS {
                let body = json!({"events": [{"type": "events.example/effects-requested",
                    "idempotencyKey": format!("order-{i}"),
                    "payload": {"effects": [
                        {"key": format!("copy-{i}"), "append": {"streamPath": "/out", "type": "x.y/copied", "payload": {"i": i}}},
                        {"key": format!("post-{i}"), "webhook": {"url": format!("{base}/ok/{i}"), "body": {"i": i}}}]}}]});
                post_until_ok(&client, &url, &format!("{SRC}:append"), &body).await;
            }
        })
    };
    for k in 0..KILLS {
        // Let some work through, then SIGKILL in the middle of it.
        let seen = r.posts.lock().unwrap().len();
        wait_for(
            "effects to run before the kill",
            Duration::from_secs(60),
            async || r.posts.lock().unwrap().len() > seen + 5 || appender.is_finished(),
        )
        .await;
        s.restart();
        *url.write().unwrap() = s.url.clone();
        eprintln!("kill {} done", k + 1);
    }
    appender.await.unwrap();
    wait_for(
        "every effect to succeed",
        Duration::from_secs(120),
        async || {
            let all = all_effects(&s, "").await;
            all.len() == 2 * ORDERS && all.iter().all(|e| e["status"] == "succeeded")
        },
    )
    .await;
    // Appends: one event per effect (the receiving stream dedups by key).
    let out = s.all_events("/v1/projects/acme/streams/out").await;
    let mut copies: HashMap<u64, usize> = HashMap::new();
    for e in out.iter().filter(|e| e["type"] == "x.y/copied") {
        *copies
            .entry(e["payload"]["i"].as_u64().unwrap())
            .or_default() += 1;
    }
    assert_eq!(copies.len(), ORDERS, "every order's append effect ran");
    assert!(copies.values().all(|n| *n == 1), "{copies:?}");
    // Webhooks: at least once; after dedup by idempotency-key, exactly the
    // set of effects, each key always with its own body.
    let posts = r.posts.lock().unwrap().clone();
    let ids: HashMap<String, Value> = all_effects(&s, "&status=succeeded")
        .await
        .into_iter()
        .filter(|e| e["target"]["webhook"].is_object())
        .map(|e| (e["id"].to_string(), e["target"]["webhook"]["body"].clone()))
        .collect();
    let keys: HashSet<String> = posts.iter().filter_map(|p| p.key.clone()).collect();
    assert_eq!(keys.len(), ORDERS);
    assert_eq!(keys, ids.keys().cloned().collect::<HashSet<_>>());
    for p in &posts {
        assert_eq!(&p.body, &ids[p.key.as_ref().unwrap()], "{p:?}");
    }
    eprintln!(
        "{} webhook posts for {ORDERS} effects across {KILLS} kills",
        posts.len()
    );
}

/// `effector` takes over from `counter` under one name: the live processor
/// continues from its checkpoint, so only a backfill gives the history the
/// new version's effects.
async fn history_without_effects(s: &Server) {
    deploy(s, "proc", "counter").await;
    wake(s, SRC, "p", "proc").await;
    three_requests(s, "x.y/backfilled").await;
    crate::processors::caught_up(s, SRC, "proc").await;
    deploy(s, "proc", "effector").await;
}

#[tokio::test]
async fn backfill_creates_one_processors_effects_for_a_range_and_nothing_the_second_time() {
    let s = Server::start_with(Some(EFFECTS), &[]);
    history_without_effects(&s).await;
    assert!(all_effects(&s, "").await.is_empty());
    let (_, before) = s.get(&format!("{SRC}:processors/proc")).await;
    let (_, state) = s.get(&format!("{SRC}:state")).await;
    let head = state["maxOffset"].as_u64().unwrap();

    // The first two requests only (offsets 3 and 4).
    let (status, first) = s
        .post(
            &format!("{SRC}:backfillProcessor"),
            json!({"component": "proc", "throughOffset": head - 1}),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["effectsCreated"], 2, "{first}");
    assert_eq!(first["effectsExisting"], 0, "{first}");
    assert_eq!(first["folded"], 2, "{first}");
    assert_eq!(first["scanned"], head - 1, "{first}");
    let (status, whole) = s
        .post(
            &format!("{SRC}:backfillProcessor"),
            json!({"component": "proc"}),
        )
        .await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(
        (&whole["effectsCreated"], &whole["effectsExisting"]),
        (&json!(1), &json!(2)),
        "{whole}"
    );
    let (_, again) = s
        .post(
            &format!("{SRC}:backfillProcessor"),
            json!({"component": "proc"}),
        )
        .await;
    assert_eq!(
        (&again["effectsCreated"], &again["effectsExisting"]),
        (&json!(0), &json!(3)),
        "{again}"
    );
    // The effects run; the processor's state and checkpoint did not change.
    for i in 0..3 {
        settled(&s, &format!("k{i}"), "succeeded").await;
    }
    let out = s.all_events("/v1/projects/acme/streams/out").await;
    assert_eq!(
        out.iter().filter(|e| e["type"] == "x.y/backfilled").count(),
        3
    );
    let (_, after) = s.get(&format!("{SRC}:processors/proc")).await;
    assert_eq!(after["state"], before["state"], "{after}");
    assert_eq!(
        after["checkpointOffset"], before["checkpointOffset"],
        "{after}"
    );

    // A narrower selection, and the errors.
    let (_, none) = s
        .post(
            &format!("{SRC}:backfillProcessor"),
            json!({"component": "proc", "jsonataCondition": "payload.effects[0].key = 'k1'"}),
        )
        .await;
    assert_eq!(
        (&none["folded"], &none["effectsExisting"]),
        (&json!(1), &json!(1)),
        "{none}"
    );
    assert_error(
        &s.post(
            &format!("{SRC}:backfillProcessor"),
            json!({"component": "nobody"}),
        )
        .await,
        404,
        "processor-not-found",
        "\"nobody\"",
    );
    assert_error(
        &s.post(
            &format!("{SRC}:backfillProcessor"),
            json!({"component": "proc", "afterOffset": head + 5}),
        )
        .await,
        400,
        "invalid-request",
        "afterOffset",
    );
}

#[tokio::test]
async fn the_cli_backfills_with_progress_and_manages_effects() {
    let s = Server::start_with(Some(EFFECTS), &[]);
    history_without_effects(&s).await;
    let (ok, out, err) = crate::support::run_cli(&[
        "backfill",
        "--url",
        &s.url,
        "--project",
        "acme",
        "/orders",
        "proc",
    ]);
    assert!(ok, "{err}");
    let result: Value = serde_json::from_str(&out).expect(&out);
    assert_eq!(result["effectsCreated"], 3, "{out}");
    // Not a terminal: progress comes as lines on stderr.
    let (_, state) = s.get(&format!("{SRC}:state")).await;
    let head = state["maxOffset"].as_u64().unwrap();
    assert!(
        err.contains(&format!("[{}] offset {head}/{head}", "#".repeat(30))),
        "{err}"
    );
    let k0 = settled(&s, "k0", "succeeded").await;
    // The page of two below needs two settled: the others may still run.
    for key in ["k1", "k2"] {
        settled(&s, key, "succeeded").await;
    }

    let (ok, out, err) = crate::support::run_cli(&[
        "effects",
        "ls",
        "--url",
        &s.url,
        "--project",
        "acme",
        "--status",
        "succeeded",
        "--component",
        "proc",
        "--limit",
        "2",
    ]);
    assert!(ok, "{err}");
    let page: Value = serde_json::from_str(&out).expect(&out);
    assert_eq!(page["effects"].as_array().unwrap().len(), 2, "{out}");
    assert_eq!(page["nextAfterId"], page["effects"][1]["id"], "{out}");
    let id = k0["id"].to_string();
    let (ok, out, err) =
        crate::support::run_cli(&["effects", "show", "--url", &s.url, "--project", "acme", &id]);
    assert!(ok, "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), k0);
    let (ok, _, err) = crate::support::run_cli(&[
        "effects",
        "retry",
        "--url",
        &s.url,
        "--project",
        "acme",
        &id,
    ]);
    assert!(!ok);
    assert!(
        err.contains("409") && err.contains("effect-not-retryable"),
        "{err}"
    );
    let (ok, _, err) = crate::support::run_cli(&[
        "backfill",
        "--url",
        &s.url,
        "--project",
        "acme",
        "/orders",
        "nobody",
    ]);
    assert!(!ok);
    assert!(
        err.contains("processor-not-found") && err.contains("nobody"),
        "{err}"
    );
}

fn resumed_lines(events: &[Value]) -> usize {
    events
        .iter()
        .filter(|e| e["type"] == "events.iterate.com/stream/subscription-delivery-resumed")
        .count()
}

#[tokio::test]
async fn a_new_version_resumes_a_subscription_its_component_halted_once_and_versions_are_listed() {
    let s = Server::start_with(Some(EFFECTS), &[]);
    let v1 = deploy(&s, "proc", "effector").await;
    wake(&s, SRC, "p", "proc").await;
    // An effect with no target: the effector fails for good and halts.
    request(&s, SRC, json!([{"key": "nothing"}])).await;
    s.wait_halted(SRC, "p", Duration::from_secs(30)).await;

    let (status, v2) = s.deploy("acme", "proc", guest("counter")).await;
    assert_eq!(status, 200, "{v2}");
    assert_eq!(
        v2["resumedSubscriptions"],
        json!([{"stream": "/orders", "subscriptionKey": "p"}]),
        "{v2}"
    );
    let p = crate::processors::caught_up(&s, SRC, "proc").await;
    assert_eq!(p["digest"], v2["digest"], "{p}");
    assert_ne!(p["status"], "halted", "{p}");
    // The same bytes again are not a new version: nothing more resumes.
    let (_, again) = s.deploy("acme", "proc", guest("counter")).await;
    assert!(again.get("resumedSubscriptions").is_none(), "{again}");
    assert_eq!(resumed_lines(&s.all_events(SRC).await), 1);

    let (status, versions) = s.get("/v1/projects/acme/components/proc/versions").await;
    assert_eq!(status, 200, "{versions}");
    let digests: Vec<&Value> = versions["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| &v["digest"])
        .collect();
    assert_eq!(digests, vec![&v2["digest"], &v1["digest"]]);
    assert!(versions["versions"][0]["deployedAt"].is_string());
    assert_error(
        &s.get("/v1/projects/acme/components/nope/versions").await,
        404,
        "component-not-found",
        "\"nope\"",
    );
}

#[tokio::test]
async fn a_refold_folds_every_instance_again_from_the_initial_state_and_switches() {
    let s = Server::start_with(Some(EFFECTS), &[]);
    deploy(&s, "proc", "counter").await;
    wake(&s, SRC, "p", "proc").await;
    three_requests(&s, "x.y/refolded").await;
    let before = crate::processors::caught_up(&s, SRC, "proc").await;
    assert_eq!(
        before["state"]["events"], 5,
        "the counter's state: {before}"
    );

    // History's effects are stored only when asked (the effect gate).
    let (status, out) = s
        .deploy_with_query(
            "acme",
            "proc",
            guest("effector"),
            "refold=true&replayEffects=true",
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["refolding"], true, "{out}");
    assert_eq!(out["refoldingStreams"], json!(["/orders"]), "{out}");
    // The effector's fold of the whole history (it consumes only the three
    // requests), not its continuation of the counter's state.
    wait_for(
        "the refold to switch",
        Duration::from_secs(30),
        async || {
            let (_, p) = s.get(&format!("{SRC}:processors/proc")).await;
            p["state"] == json!({"events": 3, "effects": 3})
        },
    )
    .await;
    let (_, after) = s.get(&format!("{SRC}:processors/proc")).await;
    assert_eq!(after["digest"], out["digest"], "{after}");
    assert_eq!(
        after["checkpointOffset"], before["checkpointOffset"],
        "{after}"
    );
    for i in 0..3 {
        settled(&s, &format!("k{i}"), "succeeded").await;
    }
    let bad = s
        .deploy_with_query("acme", "proc", guest("effector"), "refold=maybe")
        .await;
    assert_error(&bad, 400, "invalid-request", "\"maybe\"");
}

#[tokio::test]
async fn a_refold_runs_no_effect_of_history_and_one_for_each_new_event_unless_asked_to_replay() {
    let r = Receiver::start().await;
    let s = Server::start_with(Some(EFFECTS), &[]);
    // Version 1 (the counter) folds history: three events, each asking for
    // a webhook, which the counter ignores.
    deploy(&s, "proc", "counter").await;
    wake(&s, SRC, "p", "proc").await;
    let hook = |k: &str| json!([{"key": k, "webhook": {"url": format!("{}/ok/{k}", r.base), "body": {"k": k}}}]);
    for i in 0..3 {
        request(&s, SRC, hook(&format!("old-{i}"))).await;
    }
    let before = crate::processors::caught_up(&s, SRC, "proc").await;
    // Version 2 (the effector) returns the webhooks: refolded, it sends
    // none for history.
    let (status, v2) = s
        .deploy_with_query("acme", "proc", guest("effector"), "refold=true")
        .await;
    assert_eq!(status, 200, "{v2}");
    wait_for(
        "the refold to switch",
        Duration::from_secs(30),
        async || {
            let (_, p) = s.get(&format!("{SRC}:processors/proc")).await;
            p["digest"] == v2["digest"] && p["state"]["events"] == 3
        },
    )
    .await;
    let (_, after) = s.get(&format!("{SRC}:processors/proc")).await;
    assert_eq!(
        after["checkpointOffset"], before["checkpointOffset"],
        "{after}"
    );
    assert!(
        all_effects(&s, "").await.is_empty(),
        "history's effects are gated"
    );
    // New events: one effect each.
    for i in 0..2 {
        request(&s, SRC, hook(&format!("new-{i}"))).await;
    }
    settled(&s, "new-0", "succeeded").await;
    settled(&s, "new-1", "succeeded").await;
    let keys: HashSet<String> = all_effects(&s, "")
        .await
        .iter()
        .map(|e| e["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys, HashSet::from(["new-0".into(), "new-1".into()]));
    assert!(
        r.posts
            .lock()
            .unwrap()
            .iter()
            .all(|p| p.path.starts_with("/ok/new-")),
        "nothing of history was posted"
    );

    // Asked to replay: a refold (the same bytes) stores history's too,
    // deduplicated by identity.
    let (status, v3) = s
        .deploy_with_query(
            "acme",
            "proc",
            guest("effector"),
            "refold=true&replayEffects=true",
        )
        .await;
    assert_eq!(status, 200, "{v3}");
    for i in 0..3 {
        settled(&s, &format!("old-{i}"), "succeeded").await;
    }
    assert_eq!(all_effects(&s, "").await.len(), 5);
    assert_eq!(r.posts_to("/ok/new-0").len(), 1, "not run again");

    let bad = s
        .deploy_with_query("acme", "proc", guest("effector"), "replayEffects=true")
        .await;
    assert_error(&bad, 400, "invalid-request", "refold=true");
}

#[tokio::test]
async fn the_order_totals_example_confirms_orders_and_posts_them() {
    let r = Receiver::start().await;
    let s = Server::start_with(Some(EFFECTS), &[]);
    let (status, out) = s
        .deploy("acme", "order-totals", guest("order-totals"))
        .await;
    assert_eq!(status, 200, "{out}");
    let (status, out) = s
        .post(
            &format!("{SRC}:append"),
            json!({"events": [
                {"type": "events.iterate.com/stream/subscription-configured",
                 "payload": {"subscriptionKey": "totals", "receiver": {"action": "processor-wake",
                    "expression": ["components", ["get", "order-totals"], "wake"]}}},
                {"type": "events.example/order-webhook-set", "payload": {"url": format!("{}/ok/orders", r.base)}},
                {"type": "events.example/order-created", "payload": {"orderId": "o-1", "region": "eu", "total": 120}},
                {"type": "events.example/order-created", "payload": {"region": "eu", "total": 5}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    settled(&s, "confirm:o-1", "succeeded").await;
    settled(&s, "notify:o-1", "succeeded").await;
    assert_eq!(
        all_effects(&s, "").await.len(),
        2,
        "no effects for an order without an id"
    );
    let confirmed = s
        .all_events("/v1/projects/acme/streams/orders/confirmed")
        .await;
    let expected = json!({"orderId": "o-1", "region": "eu", "total": 120.0, "regionTotal": 120.0});
    assert_eq!(
        confirmed.len(),
        2,
        "created + one confirmation: {confirmed:?}"
    );
    assert_eq!(confirmed[1]["type"], "events.example/order-confirmed");
    assert_eq!(confirmed[1]["payload"], expected);
    let posts = r.posts_to("/ok/orders");
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].body, expected);
    let p = crate::processors::caught_up(&s, SRC, "order-totals").await;
    assert_eq!(
        p["state"]["regions"]["eu"],
        json!({"orders": 2, "total": 125.0})
    );
}

#[tokio::test]
async fn an_effect_running_when_the_server_died_runs_again_at_start_not_after_its_lease() {
    let r = Receiver::start().await;
    // A lease far longer than the test may wait.
    let config = EFFECTS
        .replace("timeout-ms = 1000", "timeout-ms = 100000")
        .replace("lease-ms = 1500", "lease-ms = 600000");
    let mut s = Server::start_with(Some(&config), &[]);
    effector_on(&s, SRC).await;
    request(
        &s,
        SRC,
        json!([{"key": "slow", "webhook": {"url": format!("{}/hang/1", r.base), "body": {}}}]),
    )
    .await;
    wait_for("the first attempt", Duration::from_secs(30), async || {
        r.posts_to("/hang/1").len() == 1
    })
    .await;
    assert_eq!(settled(&s, "slow", "running").await["attempts"], 1);
    s.restart();
    wait_for(
        "the attempt after the restart",
        Duration::from_secs(30),
        async || r.posts_to("/hang/1").len() == 2,
    )
    .await;
    let (_, effects) = s.get(&format!("{FX}?status=running")).await;
    assert_eq!(effects["effects"][0]["attempts"], 2, "{effects}");
}

#[tokio::test]
async fn a_refold_cut_short_by_a_crash_runs_at_the_next_start() {
    let mut s = Server::start_with(Some(EFFECTS), &[]);
    history_without_effects(&s).await;
    let (_, before) = s.get(&format!("{SRC}:processors/proc")).await;
    assert_eq!(
        before["state"]["events"], 5,
        "the counter's state: {before}"
    );
    // As if the server died right after committing `PUT ...?refold=true`:
    // the new version and its pending refold are stored, nothing ran.
    let (_, component) = s.get("/v1/projects/acme/components/proc").await;
    s.stop();
    let db = s.db();
    db.execute(&format!(
        "INSERT INTO pending_refolds (project, name, digest, requested_at) VALUES ('acme', 'proc', '{}', 't')",
        component["digest"].as_str().unwrap()
    ));
    s.restart();
    wait_for(
        "the refold to switch",
        Duration::from_secs(30),
        async || {
            let (_, p) = s.get(&format!("{SRC}:processors/proc")).await;
            p["state"] == json!({"events": 3, "effects": 3})
        },
    )
    .await;
    wait_for(
        "the pending refold to be done",
        Duration::from_secs(30),
        async || db.query_i64("SELECT COUNT(*) FROM pending_refolds") == Some(0),
    )
    .await;
}

#[tokio::test]
async fn resumes_a_new_version_owed_before_a_crash_are_appended_at_the_next_start() {
    let mut s = Server::start_with(Some(EFFECTS), &[]);
    let v1 = deploy(&s, "proc", "effector").await;
    wake(&s, SRC, "p", "proc").await;
    request(&s, SRC, json!([{"key": "nothing"}])).await;
    s.wait_halted(SRC, "p", Duration::from_secs(30)).await;
    assert_eq!(resumed_lines(&s.all_events(SRC).await), 0);
    // As if the server died right after committing a deploy of that
    // version, before appending its resumes.
    s.stop();
    let db = s.db();
    db.execute(&format!(
        "INSERT INTO pending_resumes (project, name, digest) VALUES ('acme', 'proc', '{}')",
        v1["digest"].as_str().unwrap()
    ));
    s.restart();
    wait_for("the owed resume", Duration::from_secs(30), async || {
        resumed_lines(&s.all_events(SRC).await) == 1
    })
    .await;
    wait_for("the record to go", Duration::from_secs(30), async || {
        db.query_i64("SELECT COUNT(*) FROM pending_resumes") == Some(0)
    })
    .await;
}

/// Several hosts lease due effects in one statement that skips rows another
/// transaction holds (`FOR UPDATE SKIP LOCKED`): an effect whose row is
/// locked elsewhere (another host's lease, an operator's transaction) waits
/// for its lock, and every other due effect runs meanwhile.
#[tokio::test]
async fn a_due_effect_whose_row_another_transaction_holds_does_not_hold_back_the_others() {
    if crate::cluster::on_sqlite() {
        return;
    }
    let r = Receiver::start().await;
    let s = Server::start_with(Some(EFFECTS), &[]);
    effector_on(&s, SRC).await;
    // "held" fails at once (404), then is made due again, towards /ok, by
    // an operator who keeps its row locked.
    request(
        &s,
        SRC,
        json!([{"key": "held", "webhook": {"url": format!("{}/gone/held", r.base), "body": {}}}]),
    )
    .await;
    let held = settled(&s, "held", "failed").await;
    let crate::support::TestDb::Postgres(url) = s.db() else {
        unreachable!("several hosts run on PostgreSQL")
    };
    let (locked_tx, locked_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let id = held["id"].as_i64().unwrap();
    let holder = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connecting");
        // Due in 1.5 s on the database's clock (the executor's clock on
        // PostgreSQL), locked well before that.
        c.batch_execute(&format!(
            "UPDATE effects SET status = 'pending', attempts = 0, settled_at = NULL,
                 target = replace(target, '/gone/', '/ok/'),
                 due_at_ms = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) + 1500
             WHERE id = {id}"
        ))
        .expect("making the effect due");
        let mut tx = c.transaction().expect("BEGIN");
        tx.query_one(
            &format!("SELECT id FROM effects WHERE id = {id} FOR UPDATE"),
            &[],
        )
        .expect("locking the effect's row");
        locked_tx.send(()).unwrap();
        release_rx.recv().unwrap();
        tx.rollback().expect("ROLLBACK");
    });
    locked_rx.recv().unwrap();
    let db = s.db();
    wait_for(
        "the held effect to be due",
        Duration::from_secs(10),
        async || {
            db.query_i64(&format!(
                "SELECT id FROM effects WHERE id = {id}
               AND due_at_ms <= CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"
            )) == Some(id)
        },
    )
    .await;
    // Due effects requested while the row is locked: each runs (leasing
    // them does not wait for the lock), the held one does not.
    request(
        &s,
        SRC,
        json!([{"key": "free-1", "webhook": {"url": format!("{}/ok/free-1", r.base), "body": {}}},
               {"key": "free-2", "webhook": {"url": format!("{}/ok/free-2", r.base), "body": {}}},
               {"key": "free-3", "webhook": {"url": format!("{}/ok/free-3", r.base), "body": {}}}]),
    )
    .await;
    // Meanwhile no session of this database waits for a lock (leasing row
    // by row, the writer would wait on the held row, stalling every write).
    let waiting = "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'";
    wait_for(
        "the free effects to succeed",
        Duration::from_secs(30),
        async || {
            assert_eq!(db.query_i64(waiting), Some(0), "a session waits for a lock");
            let done = all_effects(&s, "&status=succeeded").await;
            ["free-1", "free-2", "free-3"]
                .iter()
                .all(|k| done.iter().any(|e| e["key"] == *k))
        },
    )
    .await;
    for key in ["free-1", "free-2", "free-3"] {
        assert_eq!(r.posts_to(&format!("/ok/{key}")).len(), 1, "{key}");
    }
    let (_, still) = s.get(&format!("{FX}/{id}")).await;
    assert_eq!(still["status"], "pending", "{still}");
    assert_eq!(still["attempts"], 0, "{still}");
    assert!(r.posts_to("/ok/held").is_empty());
    // The lock goes: the held effect runs once.
    release_tx.send(()).unwrap();
    holder.join().expect("the holding transaction");
    let held = settled(&s, "held", "succeeded").await;
    assert_eq!(held["attempts"], 1, "{held}");
    assert_eq!(r.posts_to("/ok/held").len(), 1);
}

/// What the ordering test's receiver saw: the paths in arrival order, and
/// the most `/slow/` POSTs it held at once.
#[derive(Default)]
struct Arrivals {
    paths: Vec<String>,
    slow_now: usize,
    slow_most: usize,
}

/// A receiver for the ordering test: `/slow/*` holds each POST until the
/// test lets one go (a permit of the semaphore), then answers 200;
/// `/fail/*` 404 until `mended`; anything else 200 at once.
async fn ordering_receiver() -> (
    String,
    Arc<Mutex<Arrivals>>,
    Arc<std::sync::atomic::AtomicBool>,
    Arc<tokio::sync::Semaphore>,
) {
    #[derive(Clone)]
    struct Seen(
        Arc<Mutex<Arrivals>>,
        Arc<std::sync::atomic::AtomicBool>,
        Arc<tokio::sync::Semaphore>,
    );
    async fn hook(State(seen): State<Seen>, Path(rest): Path<String>) -> StatusCode {
        let path = format!("/{rest}");
        let slow = path.starts_with("/slow/");
        {
            let mut a = seen.0.lock().unwrap();
            a.paths.push(path.clone());
            if slow {
                a.slow_now += 1;
                a.slow_most = a.slow_most.max(a.slow_now);
            }
        }
        if slow {
            if let Ok(permit) = seen.2.acquire().await {
                permit.forget();
            }
            seen.0.lock().unwrap().slow_now -= 1;
        }
        let mended = seen.1.load(std::sync::atomic::Ordering::SeqCst);
        if path.starts_with("/fail/") && !mended {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::OK
        }
    }
    let seen = Seen(
        Arc::default(),
        Arc::default(),
        Arc::new(tokio::sync::Semaphore::new(0)),
    );
    let app = Router::new()
        .route("/{*rest}", post(hook))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen.0, seen.1, seen.2)
}

#[tokio::test]
async fn effects_of_one_group_run_one_at_a_time_in_commit_order_and_a_failed_one_holds_its_group() {
    let (base, arrivals, mended, let_go) = ordering_receiver().await;
    let s = Server::start_with(Some(EFFECTS), &[]);
    effector_on(&s, SRC).await;
    let hook = |key: &str, path: &str, group: Option<&str>| {
        let mut e = json!({"key": key, "webhook": {"url": format!("{base}{path}"), "body": {}}});
        if let Some(g) = group {
            e["group"] = json!(g);
        }
        e
    };
    // One commit: five effects of group "g" to a receiver that holds each
    // POST until let go (eight places would run them at once), a failing
    // head of "h" and of "k" before an effect each, and one without a group.
    let mut effects: Vec<Value> = (1..=5)
        .map(|i| hook(&format!("g{i}"), &format!("/slow/g{i}"), Some("g")))
        .collect();
    effects.extend([
        hook("h1", "/fail/h1", Some("h")),
        hook("h2", "/ok/h2", Some("h")),
        hook("k1", "/fail/k1", Some("k")),
        hook("k2", "/ok/k2", Some("k")),
        hook("free", "/ok/free", None),
    ]);
    request(&s, SRC, Value::Array(effects)).await;
    settled(&s, "h1", "failed").await;
    settled(&s, "k1", "failed").await;
    settled(&s, "free", "succeeded").await;
    // An effect committed after the heads failed runs: the worker has
    // looked since, and left the groups they hold.
    request(&s, SRC, json!([hook("later", "/ok/later", None)])).await;
    settled(&s, "later", "succeeded").await;
    for key in ["h2", "k2"] {
        let e = all_effects(&s, "")
            .await
            .into_iter()
            .find(|e| e["key"] == key)
            .unwrap();
        assert_eq!(
            (&e["status"], &e["attempts"], &e["group"]),
            (&json!("pending"), &json!(0), &json!(key[..1].to_string())),
            "held behind its group's failed head: {e}"
        );
    }
    // Meanwhile g1 was held all along, and nothing else of its group was
    // sent. Let each go in turn: the next of the group arrives, alone.
    let slow_paths = || -> (Vec<String>, usize) {
        let a = arrivals.lock().unwrap();
        let slow = a.paths.iter().filter(|p| p.starts_with("/slow/"));
        (slow.cloned().collect(), a.slow_now)
    };
    for i in 1..=5 {
        let expected: Vec<String> = (1..=i).map(|j| format!("/slow/g{j}")).collect();
        wait_for(
            &format!("g{i} held, alone, after the ones before it"),
            Duration::from_secs(30),
            async || slow_paths() == (expected.clone(), 1),
        )
        .await;
        let_go.add_permits(1);
    }
    for i in 1..=5 {
        settled(&s, &format!("g{i}"), "succeeded").await;
    }
    {
        let a = arrivals.lock().unwrap();
        assert_eq!(a.slow_most, 1, "one at a time: {:?}", a.paths);
        assert!(!a.paths.iter().any(|p| p == "/ok/h2" || p == "/ok/k2"));
    }
    // A retry frees its group after it (h1 first, then h2); a cancel frees
    // its group at once (k2).
    mended.store(true, std::sync::atomic::Ordering::SeqCst);
    let id = |e: Value| e["id"].clone();
    let h1 = id(settled(&s, "h1", "failed").await);
    let (status, out) = s.post(&format!("{FX}/{h1}:retry"), json!({})).await;
    assert_eq!(status, 200, "{out}");
    let k1 = id(settled(&s, "k1", "failed").await);
    let (status, out) = s.post(&format!("{FX}/{k1}:cancel"), json!({})).await;
    assert_eq!(status, 200, "{out}");
    settled(&s, "h2", "succeeded").await;
    settled(&s, "k2", "succeeded").await;
    let a = arrivals.lock().unwrap();
    let at = |path: &str| a.paths.iter().rposition(|p| p == path).unwrap();
    assert!(at("/fail/h1") < at("/ok/h2"), "{:?}", a.paths);
    assert_eq!(
        a.paths.iter().filter(|p| *p == "/fail/k1").count(),
        1,
        "the cancelled head did not run again: {:?}",
        a.paths
    );
}
