//! When a processor (or any receiver) fails: the guest's own words reach
//! the API, what cannot heal halts at once, a retry can be asked for, and
//! the failure stays readable after a release or a restart.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{assert_error, guest, wait_for, Server};

const P: &str = "/v1/projects/acme";

/// Quick retries (so a halt after retries comes fast), small idle period.
const QUICK: &str = r#"
[delivery]
max-attempts = 3
backoff-base-ms = 10
backoff-max-ms = 40
timeout-ms = 1000

[limits]
idle-stream-ms = 300
"#;

/// Retries ten minutes apart: a test that sees a retry within a minute saw
/// it asked for, not waited out.
const SLOW: &str = r#"
[delivery]
max-attempts = 10
backoff-base-ms = 600000
backoff-max-ms = 600000
timeout-ms = 1000
"#;

fn wake_subscription(component: &str) -> Value {
    json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "h", "receiver": {"action": "processor-wake",
            "expression": ["components", ["get", component], "wake"]}}}]})
}

async fn append(s: &Server, path: &str, events: Value) -> Value {
    let (status, out) = s
        .post(
            &format!("{P}/streams{path}:append"),
            json!({ "events": events }),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    out
}

/// `:runtime`'s record of subscription `h` on `path`.
async fn runtime(s: &Server, path: &str) -> Value {
    let (status, rt) = s.get(&format!("{P}/streams{path}:runtime")).await;
    assert_eq!(status, 200, "{rt}");
    rt["subscriptions"]["h"].clone()
}

/// Whether a `:runtime` record's `lastError` mentions `text`.
fn last_error_says(rt: &Value, text: &str) -> bool {
    rt["lastError"].as_str().is_some_and(|e| e.contains(text))
}

/// The hostile guest deployed as `p` on a stream at `path` holding three
/// counted events with a panicking one in the middle, then woken: its
/// first wake folds them all in one batch. Answers the panicking event's
/// offset.
async fn panicking_processor(s: &Server, path: &str) -> u64 {
    let (status, out) = s.deploy("acme", "p", guest("hostile")).await;
    assert_eq!(status, 200, "{out}");
    let out = append(
        s,
        path,
        json!([{"type": "x.y/a"}, {"type": "hostile/trap"}, {"type": "x.y/a"}]),
    )
    .await;
    let trap = out["events"][1]["offset"].as_u64().expect("an offset");
    s.post(&format!("{P}/streams{path}:append"), wake_subscription("p"))
        .await;
    trap
}

#[tokio::test]
async fn a_panicking_processor_halts_at_once_in_its_own_words_naming_the_event() {
    let s = Server::start_with(Some(QUICK), &[]);
    let trap = panicking_processor(&s, "/panics").await;
    let stream = format!("{P}/streams/panics");
    let halted = s.wait_halted(&stream, "h", Duration::from_secs(60)).await;
    let error = halted["error"].as_str().unwrap_or_default();
    // The panic's message, as the guest wrote it to stderr ...
    assert!(
        error.contains("the hostile guest traps on purpose"),
        "{halted}"
    );
    assert!(error.contains("panicked at"), "{halted}");
    // ... and a backtrace that names the guest's functions.
    assert!(error.contains("<hostile::Hostile as "), "{halted}");
    // A trap repeats on every retry: no retries.
    assert_eq!(halted["attempts"], 1, "{halted}");

    let (_, p) = s.get(&format!("{stream}:processors/p")).await;
    let failure = &p["lastFailure"];
    assert_eq!(
        failure["offset"], trap,
        "the event folded when it failed: {p}"
    );
    assert!(
        failure["message"]
            .as_str()
            .unwrap_or_default()
            .contains("the hostile guest traps on purpose"),
        "{p}"
    );
    let rt = runtime(&s, "/panics").await;
    assert!(
        last_error_says(&rt, "the hostile guest traps on purpose"),
        "{rt}"
    );
    assert_eq!(rt["attempt"], 1, "{rt}");
}

#[tokio::test]
async fn an_itx_call_that_panics_answers_the_guests_words() {
    let s = Server::start();
    let (status, out) = s.deploy("acme", "kinds", guest("kinds")).await;
    assert_eq!(status, 200, "{out}");
    let (status, out) = s
        .post(
            &format!("{P}/itx"),
            json!({"expression": ["components", ["get", "kinds"], "boom"], "args": []}),
        )
        .await;
    assert_eq!(status, 422, "{out}");
    assert_eq!(out["error"]["code"], "itx-failed", "{out}");
    let message = out["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("panicked at"), "{out}");
    assert!(message.contains("boom"), "{out}");
}

#[tokio::test]
async fn a_new_version_retries_at_once_the_processor_it_was_failing() {
    let s = Server::start_with(Some(SLOW), &[]);
    let (status, out) = s.deploy("acme", "p", guest("hostile")).await;
    assert_eq!(status, 200, "{out}");
    let out = append(
        &s,
        "/fails",
        json!([{"type": "x.y/a"}, {"type": "hostile/fail"}]),
    )
    .await;
    let _ = out;
    // The wake folds from the stream's first event (its creation).
    let first = s.all_events(&format!("{P}/streams/fails")).await[0]["offset"].clone();
    s.post(&format!("{P}/streams/fails:append"), wake_subscription("p"))
        .await;
    // A failure the guest calls retryable is retried, after a backoff.
    wait_for(
        "the wake to fail once",
        Duration::from_secs(60),
        async || runtime(&s, "/fails").await["attempt"].as_u64() >= Some(1),
    )
    .await;
    let rt = runtime(&s, "/fails").await;
    assert!(last_error_says(&rt, "fails on purpose"), "{rt}");
    assert_eq!(rt["halted"], false, "{rt}");
    let (_, p) = s.get(&format!("{P}/streams/fails:processors/p")).await;
    assert_eq!(
        p["lastFailure"]["offset"], first,
        "the batch's first event, when the batch failed as a whole: {p}"
    );
    assert_eq!(p["lastFailure"]["resolved"], false, "{p}");
    // Waiting for it says why it has not caught up.
    let (ok, _, err) = crate::support::cli_with(
        &s,
        &["processor", "/fails", "p", "--wait", "--timeout-ms", "300"],
    );
    assert!(!ok);
    assert!(
        err.contains("it is failing: ") && err.contains("fails on purpose"),
        "{err}"
    );

    // The fix: a version that folds every event.
    let (status, out) = s.deploy("acme", "p", guest("counter")).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(
        out["retryingSubscriptions"],
        json!([{"stream": "/fails", "subscriptionKey": "h"}]),
        "{out}"
    );
    let head = s.get(&format!("{P}/streams/fails:state")).await.1["maxOffset"].clone();
    wait_for(
        "the fixed processor to catch up (well before the 10-minute backoff)",
        Duration::from_secs(60),
        async || {
            let (_, p) = s.get(&format!("{P}/streams/fails:processors/p")).await;
            p["checkpointOffset"] == head
        },
    )
    .await;
    let rt = runtime(&s, "/fails").await;
    assert_eq!(rt["lastError"], Value::Null, "{rt}");
    assert_eq!(rt["attempt"], 0, "{rt}");
    // The old failure is kept, and shown as resolved.
    let (_, p) = s.get(&format!("{P}/streams/fails:processors/p")).await;
    assert_eq!(p["lastFailure"]["offset"], first, "{p}");
    assert_eq!(p["lastFailure"]["resolved"], true, "{p}");
}

/// A webhook receiver that answers 503 until `healthy` is set; records the
/// offsets it accepted.
struct Flaky {
    url: String,
    healthy: Arc<AtomicBool>,
    accepted: Arc<Mutex<Vec<u64>>>,
}

async fn flaky() -> Flaky {
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::Json;
    type Shared = (Arc<AtomicBool>, Arc<Mutex<Vec<u64>>>);
    async fn hook(
        State((healthy, accepted)): State<Shared>,
        Json(body): Json<Value>,
    ) -> StatusCode {
        if !healthy.load(Ordering::SeqCst) {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        if let Some(o) = body["event"]["offset"].as_u64() {
            accepted.lock().unwrap().push(o);
        }
        StatusCode::OK
    }
    let healthy = Arc::new(AtomicBool::new(false));
    let accepted: Arc<Mutex<Vec<u64>>> = Arc::default();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(hook))
        .with_state((healthy.clone(), accepted.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Flaky {
        url,
        healthy,
        accepted,
    }
}

/// A webhook subscription `h` on `/src` to `url`, and one event for it;
/// waits until its delivery has failed once. Answers the event's offset.
async fn failing_webhook(s: &Server, url: &str) -> u64 {
    append(
        s,
        "/src",
        json!([{"type": "events.iterate.com/stream/subscription-configured",
            "payload": {"subscriptionKey": "h", "filter": {"eventTypes": ["x.y/e"]},
                "receiver": {"action": "webhook-post", "url": url,
                    "delivery": {"start": "now", "onFailingEvent": "halt"}}}}]),
    )
    .await;
    let out = append(s, "/src", json!([{"type": "x.y/e"}])).await;
    wait_for(
        "the webhook to fail once",
        Duration::from_secs(60),
        async || runtime(s, "/src").await["attempt"].as_u64() >= Some(1),
    )
    .await;
    out["events"][0]["offset"].as_u64().unwrap()
}

#[tokio::test]
async fn resuming_a_failing_subscription_retries_it_at_once() {
    let s = Server::start_with(
        Some(&format!(
            "{SLOW}\n[webhooks]\ndeny-private-networks = false\n"
        )),
        &[],
    );
    let receiver = flaky().await;
    let offset = failing_webhook(&s, &receiver.url).await;
    let rt = runtime(&s, "/src").await;
    assert!(last_error_says(&rt, "503"), "{rt}");
    let events_before = s.all_events(&format!("{P}/streams/src")).await.len();

    receiver.healthy.store(true, Ordering::SeqCst);
    let (status, out) = s
        .post(
            &format!("{P}/streams/src:resumeSubscription"),
            json!({"subscriptionKey": "h"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out, json!({"retrying": true}));
    wait_for(
        "the retry (well before the 10-minute backoff)",
        Duration::from_secs(60),
        async || receiver.accepted.lock().unwrap().contains(&offset),
    )
    .await;
    // Nothing was halted, so nothing was appended to resume it.
    let events_after = s.all_events(&format!("{P}/streams/src")).await.len();
    assert_eq!(events_after, events_before);
    wait_for(
        "the run to be healthy again",
        Duration::from_secs(30),
        async || runtime(&s, "/src").await["lastError"].is_null(),
    )
    .await;
}

#[tokio::test]
async fn a_failing_subscriptions_last_error_survives_a_restart() {
    let mut s = Server::start_with(
        Some(&format!(
            "{SLOW}\n[webhooks]\ndeny-private-networks = false\n"
        )),
        &[],
    );
    let receiver = flaky().await;
    failing_webhook(&s, &receiver.url).await;
    // The failure is written with the cursor row, after the report.
    let before = runtime(&s, "/src").await;
    s.restart();
    wait_for(
        "the failure to be read back after the restart",
        Duration::from_secs(60),
        async || runtime(&s, "/src").await["attempt"].as_u64() >= Some(1),
    )
    .await;
    let after = runtime(&s, "/src").await;
    assert!(
        last_error_says(&after, "503"),
        "before the restart: {before}, after: {after}"
    );
    assert_eq!(after["halted"], false, "{after}");
}

#[tokio::test]
async fn a_halted_subscriptions_last_error_survives_release_and_restart() {
    let mut s = Server::start_with(Some(QUICK), &[]);
    panicking_processor(&s, "/halts").await;
    let stream = format!("{P}/streams/halts");
    s.wait_halted(&stream, "h", Duration::from_secs(60)).await;
    let check = async |s: &Server, when: &str| {
        let rt = runtime(s, "/halts").await;
        assert!(
            last_error_says(&rt, "the hostile guest traps on purpose"),
            "{when}: {rt}"
        );
        assert_eq!(rt["attempt"], 1, "{when}: {rt}");
        assert_eq!(rt["halted"], true, "{when}: {rt}");
    };
    check(&s, "halted").await;
    wait_for(
        "the halted stream to be released from memory",
        Duration::from_secs(60),
        async || s.metric("streamhost_stream_actors ").await == 0,
    )
    .await;
    check(&s, "after its release").await;
    s.restart();
    check(&s, "after a restart").await;
}

#[tokio::test]
async fn refold_true_refolds_unchanged_bytes_and_an_unchanged_deploy_says_so() {
    let s = Server::start_with(Some(QUICK), &[]);
    let (status, first) = s.deploy("acme", "c", guest("counter")).await;
    assert_eq!(status, 200, "{first}");
    assert!(first.get("unchanged").is_none(), "{first}");
    append(&s, "/r", json!([{"type": "x.y/a", "payload": {"n": 2}}])).await;
    s.post(&format!("{P}/streams/r:append"), wake_subscription("c"))
        .await;
    let head = s.get(&format!("{P}/streams/r:state")).await.1["maxOffset"].clone();
    let processor = async || s.get(&format!("{P}/streams/r:processors/c")).await.1;
    wait_for("the wake", Duration::from_secs(60), async || {
        processor().await["checkpointOffset"] == head
    })
    .await;
    let before = processor().await;

    let (status, again) = s.deploy("acme", "c", guest("counter")).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["unchanged"], true, "{again}");
    assert!(again.get("refolding").is_none(), "{again}");

    let (status, refold) = s
        .deploy_with_query("acme", "c", guest("counter"), "refold=true")
        .await;
    assert_eq!(status, 200, "{refold}");
    assert_eq!(refold["unchanged"], true, "{refold}");
    assert_eq!(refold["refolding"], true, "{refold}");
    assert_eq!(refold["refoldingStreams"], json!(["/r"]), "{refold}");
    // The refold's switch commits a new checkpoint of the same offset.
    wait_for(
        "the refold to switch",
        Duration::from_secs(60),
        async || processor().await["updatedAt"] != before["updatedAt"],
    )
    .await;
    let after = processor().await;
    assert_eq!(after["state"], before["state"], "{after}");
    assert_eq!(after["checkpointOffset"], before["checkpointOffset"]);
}

/// A copy subscription `h` on `path` to `path`-out with the filter and
/// transform given.
fn copy_subscription(path: &str, filter: Value, transform: Option<&str>) -> Value {
    let mut receiver = json!({"action": "copy-to-stream", "receivingStreamPath": format!("{path}-out"),
        "delivery": {"start": "now", "onFailingEvent": "halt"}});
    if let Some(t) = transform {
        receiver["jsonataTransform"] = json!(t);
    }
    json!([{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "h", "filter": filter, "receiver": receiver}}])
}

#[tokio::test]
async fn a_transform_or_condition_that_throws_halts_at_once_naming_where() {
    let s = Server::start_with(Some(QUICK), &[]);
    // What throws on an event throws again: no retries.
    let transform = "payload.n > 1 ? $error(\"too big: \" & payload.n) : {}";
    append(
        &s,
        "/t",
        copy_subscription("/t", json!({"eventTypes": ["x.y/e"]}), Some(transform)),
    )
    .await;
    append(&s, "/t", json!([{"type": "x.y/e", "payload": {"n": 2}}])).await;
    let halted = s
        .wait_halted(&format!("{P}/streams/t"), "h", Duration::from_secs(60))
        .await;
    assert_eq!(halted["attempts"], 1, "{halted}");
    let error = halted["error"].as_str().unwrap_or_default();
    assert!(error.contains("D3137: too big: 2"), "{halted}");
    assert!(error.contains("at character 17 of"), "{halted}");

    append(
        &s,
        "/c",
        copy_subscription(
            "/c",
            json!({"jsonataCondition": "payload.total + \"a\" > 1"}),
            None,
        ),
    )
    .await;
    append(
        &s,
        "/c",
        json!([{"type": "x.y/e", "payload": {"total": 2}}]),
    )
    .await;
    let halted = s
        .wait_halted(&format!("{P}/streams/c"), "h", Duration::from_secs(60))
        .await;
    assert_eq!(halted["attempts"], 1, "{halted}");
    let error = halted["error"].as_str().unwrap_or_default();
    assert!(error.contains("T2002"), "{halted}");
    assert!(error.contains("at character 15 of"), "{halted}");
}

#[tokio::test]
async fn from_a_panicking_processor_to_a_fixed_caught_up_one_with_what_the_errors_say() {
    let s = Server::start_with(Some(QUICK), &[]);
    let trap = panicking_processor(&s, "/walk").await;
    let stream = format!("{P}/streams/walk");
    s.wait_halted(&stream, "h", Duration::from_secs(60)).await;
    // What the user reads: the panic, where, and the command to replay it.
    let (_, p) = s.get(&format!("{stream}:processors/p")).await;
    let failure = &p["lastFailure"];
    assert_eq!(p["status"], "halted", "{p}");
    assert_eq!(failure["offset"], trap, "{p}");
    let message = failure["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("panicked at hostile/src/lib.rs")
            && message.contains("hostile guest traps"),
        "{p}"
    );
    assert!(
        failure["repro"]
            .as_str()
            .is_some_and(|r| r.starts_with("wasmtime run --invoke 'fold(")),
        "{p}"
    );
    // The fix, deployed: the halted subscription resumes by itself.
    let (status, out) = s.deploy("acme", "p", guest("counter")).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(
        out["resumedSubscriptions"],
        json!([{"stream": "/walk", "subscriptionKey": "h"}]),
        "{out}"
    );
    wait_for(
        "the fixed processor to catch up",
        Duration::from_secs(60),
        async || {
            let head = s.get(&format!("{stream}:state")).await.1["maxOffset"].clone();
            let (_, p) = s.get(&format!("{stream}:processors/p")).await;
            p["status"] == "active" && p["checkpointOffset"] == head
        },
    )
    .await;
    let rt = runtime(&s, "/walk").await;
    assert_eq!(rt["halted"], false, "{rt}");
    assert_eq!(rt["lastError"], Value::Null, "{rt}");
}

#[tokio::test]
async fn healthz_detail_lists_the_halted_then_the_failing_and_plain_healthz_stays_ok() {
    let s = Server::start_with(Some(SLOW), &[]);
    // A webhook nothing listens on: failed once, retrying in ten minutes.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    failing_webhook(&s, &format!("http://127.0.0.1:{closed}/hook")).await;
    // A processor that panics: halted at once.
    panicking_processor(&s, "/panics").await;
    s.wait_halted(&format!("{P}/streams/panics"), "h", Duration::from_secs(60))
        .await;

    // What a load balancer asks is unchanged: the server is fine.
    let (status, plain) = s.get("/healthz").await;
    assert_eq!((status, &plain), (200, &json!({"status": "ok"})));

    let (status, detail) = s.get("/healthz?detail=true").await;
    assert_eq!(status, 200, "{detail}");
    let keys: Vec<&String> = detail.as_object().unwrap().keys().take(3).collect();
    assert_eq!(keys, ["attention", "halted", "failing"], "{detail}");
    assert_eq!(detail["attention"], "1 halted, 1 failing", "{detail}");
    assert_eq!(detail["status"], "ok", "{detail}");
    assert_eq!(detail["truncated"], false, "{detail}");
    let halted = &detail["halted"][0];
    assert_eq!(halted["project"], "acme", "{detail}");
    assert_eq!(halted["stream"], "/panics", "{detail}");
    assert_eq!(halted["subscription"], "h", "{detail}");
    assert_eq!(halted["processor"], "p", "{detail}");
    assert!(
        halted["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("the hostile guest traps on purpose")),
        "{detail}"
    );
    let failing = &detail["failing"][0];
    assert_eq!(failing["stream"], "/src", "{detail}");
    assert_eq!(failing["subscription"], "h", "{detail}");
    assert!(failing.get("processor").is_none(), "{detail}");
    assert!(failing["attempts"].as_u64() >= Some(1), "{detail}");
    assert!(
        failing["lastError"]
            .as_str()
            .is_some_and(|e| e.contains(&closed.to_string())),
        "{detail}"
    );

    // A query it does not know is refused, naming it.
    assert_error(
        &s.get("/healthz?detail=yes").await,
        400,
        "invalid-request",
        "\"detail=yes\"",
    );
}
