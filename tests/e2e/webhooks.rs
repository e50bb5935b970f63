//! Webhook delivery to a real loopback HTTP receiver.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::subscriptions::{wait_for_type, FAST, P};
use crate::support::{wait_for, Server};

/// A receiver that records every POST and answers 422 to events whose
/// payload says `"bad": true`. `/redirect` answers 307 to `/hook`.
struct Receiver {
    url: String,
    posts: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    fn redirect_url(&self) -> String {
        self.url.replace("/hook", "/redirect")
    }
}

async fn receiver() -> Receiver {
    let posts: Arc<Mutex<Vec<Value>>> = Arc::default();
    async fn hook(
        State(posts): State<Arc<Mutex<Vec<Value>>>>,
        Json(body): Json<Value>,
    ) -> (StatusCode, &'static str) {
        let bad = body["event"]["payload"]["bad"] == true;
        posts.lock().unwrap().push(body);
        if bad {
            (StatusCode::UNPROCESSABLE_ENTITY, "bad event")
        } else {
            (StatusCode::OK, "ok")
        }
    }
    async fn redirect() -> (StatusCode, [(&'static str, &'static str); 1]) {
        (StatusCode::TEMPORARY_REDIRECT, [("location", "/hook")])
    }
    let app = Router::new()
        .route("/hook", post(hook))
        .route("/redirect", post(redirect))
        .with_state(posts.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Receiver { url, posts }
}

fn webhook(url: &str, on_failing: &str, transform: Option<&str>) -> Value {
    let mut receiver = json!({"action": "webhook-post", "url": url,
        "delivery": {"start": "now", "onFailingEvent": on_failing}});
    if let Some(t) = transform {
        receiver["jsonataTransform"] = json!(t);
    }
    json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "hook", "filter": {"eventTypes": ["x.y/e"]}, "receiver": receiver}}]})
}

async fn append(s: &Server, events: Value) {
    let (status, out) = s
        .post(&format!("{P}/src:append"), json!({ "events": events }))
        .await;
    assert_eq!(status, 200, "{out}");
}

#[tokio::test]
async fn webhooks_arrive_in_order_one_per_post_with_the_envelope() {
    let r = receiver().await;
    let s = Server::start_with(Some(FAST), &[]);
    let (_, configured) = s
        .post(
            &format!("{P}/src:append"),
            webhook(
                &r.url,
                "halt",
                Some("{\"payload\": {\"doubled\": payload.n * 2}}"),
            ),
        )
        .await;
    append(&s, json!([
        {"type": "x.y/e", "payload": {"n": 1}}, {"type": "x.y/skip-me"}, {"type": "x.y/e", "payload": {"n": 2}},
        {"type": "x.y/e", "payload": {"n": 3}, "ephemeral": true}, {"type": "x.y/e", "payload": {"n": 4}},
    ]))
    .await;
    let posts = r.posts.clone();
    wait_for("three webhooks", Duration::from_secs(20), async || {
        posts.lock().unwrap().len() >= 3
    })
    .await;
    let (_, state) = s.get(&format!("{P}/src:state")).await;
    let got = r.posts.lock().unwrap().clone();
    assert_eq!(got.len(), 3, "{got:#?}");
    let offsets: Vec<_> = got
        .iter()
        .map(|p| p["event"]["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(
        offsets,
        vec![3, 5, 7],
        "in order, one event per POST, no ephemeral event"
    );
    let first = &got[0];
    assert_eq!(
        first["event"]["payload"],
        json!({"doubled": 2}),
        "the transform shapes the posted event"
    );
    assert_eq!(first["event"]["type"], "x.y/e");
    assert_eq!(first["projectId"], "acme");
    assert_eq!(first["path"], "/src");
    assert_eq!(first["streamId"], state["streamId"]);
    assert_eq!(first["streamCreatedAt"], state["createdAt"]);
    assert_eq!(first["subscriptionKey"], "hook");
    assert_eq!(first["cursorChangedAtSourceOffset"], 2);
    assert_eq!(first["attempt"], 1);
    assert!(first["deliveryId"].as_str().unwrap().ends_with(":3"));
    assert_eq!(first["configuredEvent"], configured["events"][0]);
    assert!(
        first.get("state").is_none(),
        "no reduced state in the envelope"
    );
}

#[tokio::test]
async fn skip_policy_attempts_a_failing_event_three_times_then_skips_it() {
    let r = receiver().await;
    let s = Server::start_with(Some(FAST), &[]);
    s.post(&format!("{P}/src:append"), webhook(&r.url, "skip", None))
        .await;
    append(&s, json!([{"type": "x.y/e", "payload": {"bad": true}}, {"type": "x.y/e", "payload": {"n": 2}}])).await;
    let posts = r.posts.clone();
    wait_for(
        "the next event after the skip",
        Duration::from_secs(20),
        async || {
            posts
                .lock()
                .unwrap()
                .iter()
                .any(|p| p["event"]["payload"]["n"] == 2)
        },
    )
    .await;
    let got = r.posts.lock().unwrap().clone();
    let seen: Vec<(u64, u64)> = got
        .iter()
        .map(|p| {
            (
                p["event"]["offset"].as_u64().unwrap(),
                p["attempt"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(seen, vec![(3, 1), (3, 2), (3, 3), (4, 1)]);
    assert!(
        got[..3]
            .iter()
            .all(|p| p["deliveryId"] == got[0]["deliveryId"]),
        "one delivery id across retries"
    );
    // The skip line commits in the actor's next write group, which can land
    // after the next event was delivered: wait for it.
    let lines = wait_for_type(&s, "/src", "events.iterate.com/stream/error-occurred").await;
    let skipped = &lines[0];
    let message = skipped["payload"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("subscription \"hook\" skipped failing event at offset 3 after 3 event-specific attempts: webhook responded 422 bad event"),
        "{message}"
    );
    // /metrics counts the skip (not a halt) and the attempts (the count
    // follows the line's commit).
    wait_for(
        "the skip in /metrics",
        Duration::from_secs(10),
        async || {
            s.metric("streamhost_subscription_skips_total{receiver=\"webhook\"}")
                .await
                == 1
        },
    )
    .await;
    assert_eq!(
        s.metric("streamhost_subscription_halts_total{receiver=\"webhook\"}")
            .await,
        0
    );
    assert_eq!(
        s.metric("streamhost_delivery_attempts_total{receiver=\"webhook\",outcome=\"failed\"}")
            .await,
        3
    );
}

#[tokio::test]
async fn three_skips_in_a_row_halt_even_across_a_restart() {
    let r = receiver().await;
    let mut s = Server::start_with(Some(FAST), &[]);
    s.post(&format!("{P}/src:append"), webhook(&r.url, "skip", None))
        .await;
    append(
        &s,
        json!([{"type": "x.y/e", "payload": {"bad": true, "i": 1}}]),
    )
    .await;
    wait_for("the first skip", Duration::from_secs(20), async || {
        s.all_events(&format!("{P}/src"))
            .await
            .iter()
            .any(|e| e["type"] == "events.iterate.com/stream/error-occurred")
    })
    .await;
    s.restart();
    append(
        &s,
        json!([
            {"type": "x.y/e", "payload": {"bad": true, "i": 2}},
            {"type": "x.y/e", "payload": {"bad": true, "i": 3}},
            {"type": "x.y/e", "payload": {"n": 4}},
        ]),
    )
    .await;
    halted(&s).await;
    let got = r.posts.lock().unwrap().clone();
    assert!(
        got.iter().all(|p| p["event"]["payload"]["n"] != 4),
        "nothing after the halt is delivered"
    );
    let skips = s
        .all_events(&format!("{P}/src"))
        .await
        .iter()
        .filter(|e| e["type"] == "events.iterate.com/stream/error-occurred")
        .count();
    assert_eq!(
        skips, 2,
        "the third failing event halts instead of being skipped"
    );
}

async fn halted(s: &Server) -> Value {
    s.wait_halted(&format!("{P}/src"), "hook", Duration::from_secs(20))
        .await
}

#[tokio::test]
async fn redirects_are_never_followed() {
    let r = receiver().await;
    let s = Server::start_with(Some(FAST), &[]);
    s.post(
        &format!("{P}/src:append"),
        webhook(&r.redirect_url(), "halt", None),
    )
    .await;
    append(&s, json!([{"type": "x.y/e", "payload": {"n": 1}}])).await;
    let halt = halted(&s).await;
    let error = halt["error"].as_str().unwrap();
    assert!(
        error.contains("webhook responded 307 redirecting to /hook: redirects are not followed"),
        "{halt}"
    );
    assert_eq!(halt["attempts"], 3, "{halt}");
    assert!(
        r.posts.lock().unwrap().is_empty(),
        "the redirect's target got nothing"
    );
}

#[tokio::test]
async fn deny_private_networks_refuses_loopback_targets_after_resolution() {
    if crate::support::skipped_on_postgres(
        "the address policy is the webhook client's, the same on either storage",
    ) {
        return;
    }
    let r = receiver().await;
    let config = format!("{FAST}\n[webhooks]\ndeny-private-networks = true\n");
    for (url, named) in [
        (r.url.clone(), "127.0.0.1, a loopback address"),
        (
            r.url.replace("127.0.0.1", "localhost"),
            "a loopback address",
        ),
    ] {
        let s = Server::start_with(Some(&config), &[]);
        s.post(&format!("{P}/src:append"), webhook(&url, "halt", None))
            .await;
        append(&s, json!([{"type": "x.y/e", "payload": {"n": 1}}])).await;
        let halt = halted(&s).await;
        let error = halt["error"].as_str().unwrap();
        assert!(error.contains(named), "{url}: {halt}");
        assert!(error.contains("deny-private-networks"), "{halt}");
        assert_eq!(halt["attempts"], 1, "refused at once: {halt}");
    }
    // Under skip, a refused address is a final failure of the event: skipped
    // at once, with the reason.
    let s = Server::start_with(Some(&config), &[]);
    s.post(&format!("{P}/src:append"), webhook(&r.url, "skip", None))
        .await;
    append(&s, json!([{"type": "x.y/e", "payload": {"n": 1}}])).await;
    s.assert_skipped_at_once(&format!("{P}/src"), "hook", &["deny-private-networks"])
        .await;
    assert!(r.posts.lock().unwrap().is_empty(), "nothing was posted");
    // The default lets loopback targets through (the other tests here).
}

/// A transform that throws on an event is a final failure (the same event
/// would throw on every retry): a webhook and a copy receiver under `halt`
/// halt at once, an ITX receiver under `skip` skips the event at once, each
/// after delivering the events before it in the same batch. Each halt and
/// the skip name the JSONata error and the event it failed on.
#[tokio::test]
async fn a_transform_that_throws_at_delivery_halts_or_skips_at_once_after_the_events_before_it() {
    let r = receiver().await;
    let s = Server::start_with(Some(FAST), &[]);
    let (status, out) = s
        .deploy("acme", "kinds", crate::support::guest("kinds"))
        .await;
    assert_eq!(status, 200, "{out}");
    let transform = "payload.n > 1 ? $error(\"too big: \" & payload.n) : {\"payload\": payload}";
    let (status, out) = s
        .post(
            &format!("{P}/src:append"),
            webhook(&r.url, "halt", Some(transform)),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let itx = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "itx", "filter": {"eventTypes": ["x.y/e"]},
            "receiver": {"action": "itx-call", "jsonataTransform": transform,
                "expression": ["components", ["get", "kinds"], "processEventBatch"],
                "delivery": {"start": "now", "onFailingEvent": "skip"}}}}]});
    let (status, out) = s.post(&format!("{P}/src:append"), itx).await;
    assert_eq!(status, 200, "{out}");
    let copy = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "copy", "filter": {"eventTypes": ["x.y/e"]},
            "receiver": {"action": "copy-to-stream", "receivingStreamPath": "/src-out",
                "jsonataTransform": transform,
                "delivery": {"start": "now", "onFailingEvent": "halt"}}}}]});
    let (status, out) = s.post(&format!("{P}/src:append"), copy).await;
    assert_eq!(status, 200, "{out}");
    let (status, out) = s
        .post(
            &format!("{P}/src:append"),
            json!({"events": [{"type": "x.y/e", "payload": {"n": 1}},
                              {"type": "x.y/e", "payload": {"n": 2}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let (ok, bad) = (
        out["events"][0]["offset"].as_u64().unwrap(),
        out["events"][1]["offset"].as_u64().unwrap(),
    );
    for key in ["hook", "copy"] {
        let halted = s
            .wait_halted(&format!("{P}/src"), key, Duration::from_secs(20))
            .await;
        assert_eq!(halted["attempts"], 1, "{key}: {halted}");
        assert_eq!(halted["afterOffset"], ok, "{key}: {halted}");
        let error = halted["error"].as_str().unwrap_or_default();
        assert!(error.contains("D3137: too big: 2"), "{key}: {halted}");
        assert!(error.contains(&format!("offset {bad}")), "{key}: {halted}");
    }
    // The ITX receiver skipped it at once, with what it said.
    let src = format!("{P}/src");
    s.wait_acknowledged(
        &src,
        "itx",
        bad,
        "the ITX receiver to skip the event that throws",
    )
    .await;
    let skip = s
        .assert_skipped_at_once(&src, "itx", &["D3137: too big: 2"])
        .await;
    assert_eq!(skip["payload"]["offset"], bad, "{skip}");
    // What each receiver got: the first event, transformed, and nothing of
    // the second.
    let posts = r.posts.lock().unwrap().clone();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0]["event"]["offset"], ok);
    assert_eq!(posts[0]["event"]["payload"], json!({"n": 1}));
    let log = s.log();
    let batches: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("itx batch delivery-id="))
        .collect();
    assert_eq!(batches.len(), 1, "{batches:?}");
    assert!(
        batches[0].contains(&format!("offsets={ok} ")),
        "{batches:?}"
    );
    // /metrics: a halt for the webhook and the copy, a skip for the ITX
    // receiver, and the attempts that led there (each kind succeeded once
    // and failed once).
    for (kind, halts, skips) in [("webhook", 1, 0), ("itx", 0, 1), ("copy", 1, 0)] {
        let of = |name: &str| format!("streamhost_{name}_total{{receiver=\"{kind}\"");
        // (The count follows the fact's commit.)
        wait_for(
            "the halt or skip in /metrics",
            Duration::from_secs(10),
            async || {
                s.metric(&of("subscription_halts")).await == halts
                    && s.metric(&of("subscription_skips")).await == skips
            },
        )
        .await;
        let attempts = |outcome: &str| {
            format!(
                "streamhost_delivery_attempts_total{{receiver=\"{kind}\",outcome=\"{outcome}\"}}"
            )
        };
        assert_eq!(s.metric(&attempts("failed")).await, 1, "{kind}");
        assert!(s.metric(&attempts("ok")).await >= 1, "{kind}");
    }
    // The halted runs stay behind: named among the furthest behind, and
    // counted (the stream is in memory).
    for key in ["hook", "copy"] {
        let lag = s
            .metric(&format!(
                "streamhost_subscription_lag_events{{stream=\"acme:/src\",subscription=\"{key}\"}}"
            ))
            .await;
        assert!(lag >= 1, "{key}: lag {lag}");
    }
    assert!(s.metric("streamhost_subscriptions_lagging ").await >= 2);
    let copies: Vec<Value> = s
        .all_events(&format!("{P}/src-out"))
        .await
        .into_iter()
        .filter(|e| e["type"] == "x.y/e")
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(copies[0]["payload"], json!({"n": 1}));
}

#[tokio::test]
async fn a_runs_attempts_next_attempt_error_bytes_and_latency_survive_a_restart() {
    // A retry a minute away: the failing run is still waiting at restart.
    const SLOW_RETRY: &str = "[delivery]\nmax-attempts = 10\nbackoff-base-ms = 60000\nbackoff-max-ms = 60000\ntimeout-ms = 2000\n";
    let r = receiver().await;
    let mut s = Server::start_with(Some(SLOW_RETRY), &[]);
    s.post(&format!("{P}/src:append"), webhook(&r.url, "halt", None))
        .await;
    append(
        &s,
        json!([{"type": "x.y/e", "payload": {"n": 1}}, {"type": "x.y/e", "payload": {"n": 2}}]),
    )
    .await;
    append(&s, json!([{"type": "x.y/e", "payload": {"bad": true}}])).await;
    let view = async |s: &Server| {
        let (status, rt) = s.get(&format!("{P}/src:runtime")).await;
        assert_eq!(status, 200, "{rt}");
        rt["subscriptions"]["hook"].clone()
    };
    let mut before = Value::Null;
    wait_for(
        "the bad event's first attempt to fail",
        Duration::from_secs(20),
        async || {
            before = view(&s).await;
            before["attempt"] == 1 && before["nextAttemptAt"].is_i64()
        },
    )
    .await;
    assert!(before["bytesSent"].as_u64().unwrap() > 0, "{before}");
    assert_eq!(before["completionLatencyMs"]["count"], 2, "{before}");
    assert!(
        before["lastError"].as_str().unwrap().contains("422"),
        "{before}"
    );
    assert!(before["lastDeliveryAt"].is_i64(), "{before}");
    let posts = r.posts.lock().unwrap().len();
    // The failed attempt's counters reach the row with the actor's next
    // write, shortly after the view shows them: the restart comes after.
    let db = s.db();
    wait_for(
        "the failed attempt's counters to be stored",
        Duration::from_secs(20),
        async || {
            db.query_i64(
                "SELECT attempts FROM subscription_cursors WHERE subscription_key = 'hook'",
            ) == Some(1)
        },
    )
    .await;
    // Nothing moved meanwhile: the retry is a minute away.
    assert_eq!(view(&s).await, before);

    s.restart();
    let after = view(&s).await;
    for field in [
        "attempt",
        "nextAttemptAt",
        "lastError",
        "bytesSent",
        "completionLatencyMs",
        "deliveryDurationMs",
        "lastDeliveryAt",
        "acknowledgedOffset",
    ] {
        assert_eq!(
            after[field], before[field],
            "{field} after the restart: {after}"
        );
    }
    // The retry is still a minute away: the restart did not bring it forward.
    assert_eq!(r.posts.lock().unwrap().len(), posts);
}

/// When each POST arrived, by path.
type Seen = Arc<Mutex<Vec<(String, std::time::Instant)>>>;

/// A receiver that keeps when each POST arrived and answers `200`, or,
/// `limiting`, answers the first POST to each path `429` with
/// `retry-after: 2` first.
async fn timing_receiver(limiting: bool) -> (String, Seen) {
    let seen: Seen = Arc::default();
    async fn hook(
        State((seen, limiting)): State<(Seen, bool)>,
        uri: axum::http::Uri,
    ) -> axum::response::Response {
        use axum::response::IntoResponse;
        let path = uri.path().to_string();
        let first = {
            let mut seen = seen.lock().unwrap();
            let first = !seen.iter().any(|(p, _)| *p == path);
            seen.push((path, std::time::Instant::now()));
            first
        };
        if first && limiting {
            (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "2")],
                "slow down",
            )
                .into_response()
        } else {
            (StatusCode::OK, "ok").into_response()
        }
    }
    let app = Router::new()
        .route("/{*rest}", post(hook))
        .with_state((seen.clone(), limiting));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

#[tokio::test]
async fn a_receivers_429_retry_after_is_waited_for_by_deliveries_and_effects() {
    // Backoff of 50 ms: without the receiver's word, the second attempt
    // would come at once.
    let s = Server::start_with(Some(FAST), &[]);
    let (base, seen) = timing_receiver(true).await;
    let sub = webhook(&format!("{base}/delivery"), "halt", None);
    append(&s, sub["events"].clone()).await;
    append(&s, json!([{"type": "x.y/e", "payload": {"n": 1}}])).await;
    crate::effects::effector_on(&s, "/v1/projects/acme/streams/orders").await;
    crate::effects::request(
        &s,
        "/v1/projects/acme/streams/orders",
        json!([{"key": "limited", "webhook": {"url": format!("{base}/effect"), "body": {}}}]),
    )
    .await;
    let times = |path: &str| -> Vec<std::time::Instant> {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, t)| *t)
            .collect()
    };
    wait_for("both retried", Duration::from_secs(30), async || {
        times("/delivery").len() >= 2 && times("/effect").len() >= 2
    })
    .await;
    for path in ["/delivery", "/effect"] {
        let t = times(path);
        let waited = t[1] - t[0];
        assert!(
            waited >= Duration::from_millis(1900),
            "{path}: the second attempt came {waited:?} after a 429 with retry-after: 2"
        );
        assert_eq!(t.len(), 2, "{path}: one retry, then delivered");
    }
}

#[tokio::test]
async fn posts_to_one_destination_keep_to_its_rate() {
    // Five a second to one host name: six effects at once arrive 200 ms
    // apart.
    let config = format!("{FAST}\n[effects]\nper-destination-rate = 5\n");
    let s = Server::start_with(Some(&config), &[]);
    let (base, seen) = timing_receiver(false).await;
    let fx = "/v1/projects/acme/streams/fx";
    crate::effects::effector_on(&s, fx).await;
    let effects: Vec<Value> = (0..6)
        .map(|i| json!({"key": format!("e{i}"), "webhook": {"url": format!("{base}/e/{i}"), "body": {}}}))
        .collect();
    crate::effects::request(&s, fx, Value::Array(effects)).await;
    wait_for("the six POSTs", Duration::from_secs(30), async || {
        seen.lock().unwrap().len() >= 6
    })
    .await;
    let mut times: Vec<std::time::Instant> = seen.lock().unwrap().iter().map(|(_, t)| *t).collect();
    times.sort();
    let spread = times[5] - times[0];
    assert!(
        spread >= Duration::from_millis(900),
        "six POSTs at 5 a second took {spread:?} (at least 1 s expected)"
    );
    assert_eq!(times.len(), 6, "each once");
}
