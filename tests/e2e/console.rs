//! The web console at `/console`, driven in headless Chromium by
//! `tests/console/drive.mjs` (Playwright): list streams, open one, see an
//! event arrive live, resume a halted subscription and see the held events
//! delivered to a real webhook receiver. With `CONSOLE_SCREENSHOTS=docs` it
//! writes the screenshots the README shows.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::support::{guest, wait_for, Server, TOKENS};

const STREAM: &str = "/v1/projects/acme/streams/orders";

async fn append(s: &Server, events: Value) -> Value {
    let (status, out) = s
        .post(&format!("{STREAM}:append"), json!({ "events": events }))
        .await;
    assert_eq!(status, 200, "{out}");
    out
}

#[tokio::test]
async fn the_console_shows_streams_live_events_and_resumes_a_halted_subscription() {
    if crate::support::skipped_on_postgres("the console is pages over the HTTP API") {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");

    // The webhook receiver is on loopback, which tokens deny by default.
    let config = format!(
        "{TOKENS}\n[delivery]\nmax-attempts = 1\nbackoff-base-ms = 10\n\
         [webhooks]\ndeny-private-networks = false\n"
    );
    let mut s = Server::start_with(Some(&config), &[]);
    s.token = Some("t-acme".into());
    let (status, out) = s.deploy("acme", "effector", guest("effector")).await;
    assert_eq!(status, 200, "{out}");
    let (status, out) = s.deploy("acme", "ledger", guest("ledger")).await;
    assert_eq!(status, 200, "{out}");

    // A processor with an effect, and a webhook that halts: its receiver
    // answers 503 until armed.
    let receiver = Receiver::start().await;
    let out = append(
        &s,
        json!([
            {"type": "events.iterate.com/stream/subscription-configured",
             "payload": {"subscriptionKey": "effects", "receiver": {"action": "processor-wake",
                "expression": ["components", ["get", "effector"], "wake"]}}},
            {"type": "events.iterate.com/stream/subscription-configured",
             "payload": {"subscriptionKey": "hook", "receiver": {"action": "webhook-post",
                "url": receiver.url.clone(),
                "delivery": {"start": "beginning", "onFailingEvent": "halt"}}}},
            {"type": "events.iterate.com/stream/subscription-configured",
             "payload": {"subscriptionKey": "ledger", "receiver": {"action": "processor-wake",
                "expression": ["components", ["get", "ledger"], "wake"]}}},
            {"type": "deposited", "payload": {"account": "acct-1", "cents": 5}},
            {"type": "events.example/effects-requested", "payload": {"effects": [
                {"key": "confirm-1", "append": {"streamPath": "/orders/confirmed",
                    "type": "events.example/order-confirmed", "payload": {"order": 1}}}]}},
        ]),
    )
    .await;
    let traced = out["events"][4]["offset"].clone();
    s.wait_halted(STREAM, "hook", Duration::from_secs(20)).await;

    // Now the receiver takes what it is sent.
    receiver.arm();
    let posts = receiver.posts.clone();

    let shots = std::env::var("CONSOLE_SCREENSHOTS")
        .map(|d| root.join(d))
        .unwrap_or_else(|_| s.dir.path().to_path_buf());
    let args = json!({
        "url": s.url, "project": "acme", "token": "t-acme", "stream": "/orders",
        "subscription": "hook", "shots": shots, "traced": traced,
    });
    drive(args).await;
    for shot in ["streams", "stream", "trace", "components", "effects"] {
        assert!(
            shots.join(format!("console-{shot}.png")).is_file(),
            "{shot}"
        );
    }

    // The resume the console sent delivered the held events, the live one
    // included, to the receiver.
    wait_for(
        "the held events delivered",
        Duration::from_secs(20),
        async || {
            posts
                .lock()
                .unwrap()
                .iter()
                .any(|p| p["event"]["type"] == "events.example/live")
        },
    )
    .await;
    let types: Vec<Value> = posts
        .lock()
        .unwrap()
        .iter()
        .map(|p| p["event"]["type"].clone())
        .collect();
    assert!(
        types.contains(&json!("events.example/effects-requested")),
        "{types:?}"
    );
    // Looking at the stream changed nothing: no connection was recorded.
    let recorded: Vec<Value> = s
        .all_events(STREAM)
        .await
        .into_iter()
        .filter(|e| {
            e["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("events.iterate.com/stream/connection-"))
        })
        .collect();
    assert!(recorded.is_empty(), "the console appended {recorded:?}");
}

/// A webhook receiver on loopback at `/hook`: `503` until armed, then
/// `200`, keeping the bodies it took.
struct Receiver {
    url: String,
    armed: Arc<AtomicBool>,
    posts: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        type Shared = (Arc<AtomicBool>, Arc<Mutex<Vec<Value>>>);
        let shared: Shared = Default::default();
        async fn hook(State((armed, posts)): State<Shared>, Json(body): Json<Value>) -> StatusCode {
            if !armed.load(Ordering::SeqCst) {
                return StatusCode::SERVICE_UNAVAILABLE;
            }
            posts.lock().unwrap().push(body);
            StatusCode::OK
        }
        let app = Router::new()
            .route("/hook", post(hook))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver {
            url,
            armed: shared.0,
            posts: shared.1,
        }
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }
}

/// Runs the console driver with `args`; fails the test with its output.
async fn drive(args: Value) {
    let driver_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/console");
    assert!(
        driver_dir.join("node_modules/playwright-core").is_dir(),
        "the console driver's packages are missing: npm ci --prefix tests/console \
         (./scripts/test does it)"
    );
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: apt-get install chromium (./scripts/test does it as root)"
    );
    let out = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg("drive.mjs")
            .arg(args.to_string())
            .current_dir(&driver_dir)
            .output()
            .expect("running node")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "the console driver failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn the_console_shows_a_failing_subscription_in_red_and_retries_it_now() {
    if crate::support::skipped_on_postgres("the console is pages over the HTTP API") {
        return;
    }
    // Ten minutes between retries: only the console's retry can deliver.
    let config = format!(
        "{TOKENS}\n[delivery]\nmax-attempts = 5\nbackoff-base-ms = 600000\nbackoff-max-ms = 600000\n\
         [webhooks]\ndeny-private-networks = false\n"
    );
    let mut s = Server::start_with(Some(&config), &[]);
    s.token = Some("t-acme".into());
    let receiver = Receiver::start().await;
    append(
        &s,
        json!([
            {"type": "events.iterate.com/stream/subscription-configured",
             "payload": {"subscriptionKey": "slow", "receiver": {"action": "webhook-post",
                "url": receiver.url.clone(),
                "delivery": {"start": "beginning", "onFailingEvent": "halt"}}}},
            {"type": "events.example/held"},
        ]),
    )
    .await;
    wait_for(
        "the webhook to fail once",
        Duration::from_secs(20),
        async || {
            let (_, rt) = s.get(&format!("{STREAM}:runtime")).await;
            rt["subscriptions"]["slow"]["attempt"] == 1
        },
    )
    .await;
    // Now the receiver takes what it is sent; the run still waits out its
    // backoff.
    receiver.arm();
    let posts = receiver.posts.clone();

    drive(
        json!({"url": s.url, "project": "acme", "token": "t-acme", "stream": "/orders",
        "failing": "slow"}),
    )
    .await;
    wait_for(
        "the held event delivered",
        Duration::from_secs(20),
        async || {
            posts
                .lock()
                .unwrap()
                .iter()
                .any(|p| p["event"]["type"] == "events.example/held")
        },
    )
    .await;
}

#[tokio::test]
async fn the_console_shows_a_shadows_diff_a_past_state_and_promotes_it() {
    if crate::support::skipped_on_postgres("the console is pages over the HTTP API") {
        return;
    }
    let mut s = Server::start_with(Some(TOKENS), &[]);
    s.token = Some("t-acme".into());
    let (status, v1) = s.deploy("acme", "proc", guest("counter")).await;
    assert_eq!(status, 200, "{v1}");
    append(
        &s,
        json!([
            {"type": "events.iterate.com/stream/subscription-configured",
             "payload": {"subscriptionKey": "p", "receiver": {"action": "processor-wake",
                "expression": ["components", ["get", "proc"], "wake"]}}},
            {"type": "events.example/effects-requested", "payload": {"effects": []}},
            {"type": "events.example/effects-requested", "payload": {"effects": []}},
        ]),
    )
    .await;
    crate::processors::caught_up(&s, STREAM, "proc").await;
    let (status, v2) = s
        .deploy_with_query("acme", "proc", guest("effector"), "refold=shadow")
        .await;
    assert_eq!(status, 200, "{v2}");
    // What the slider must show at offset 2: the live version's fold.
    let (status, at) = s.get(&format!("{STREAM}:processors/proc/at/2")).await;
    assert_eq!(status, 200, "{at}");
    let at_shows = format!("\"events\": {}", at["state"]["events"]);

    let shots = std::env::var("CONSOLE_SCREENSHOTS")
        .map(|d| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(d))
        .unwrap_or_else(|_| s.dir.path().to_path_buf());
    drive(json!({
        "url": s.url, "project": "acme", "token": "t-acme", "stream": "/orders",
        "shadow": "proc", "at": 2, "atShows": at_shows, "digest": v2["digest"], "shots": shots,
    }))
    .await;
    assert!(shots.join("console-shadow.png").is_file());
    // The button promoted the instance.
    let (_, p) = s.get(&format!("{STREAM}:processors/proc")).await;
    assert_eq!(p["digest"], v2["digest"], "{p}");
}

#[tokio::test]
async fn the_console_lists_parked_ingest_and_redrives_or_discards_it() {
    if crate::support::skipped_on_postgres("the console is pages over the HTTP API") {
        return;
    }
    let mut s = Server::start_with(Some(TOKENS), &[]);
    s.token = Some("t-acme".into());
    let (status, out) = s.deploy("acme", "welcome", guest("welcome")).await;
    assert_eq!(status, 200, "{out}");
    crate::reactors::welcome_reactor(&s, STREAM, "welcome.v1").await;
    // Two sign-ups without a userId: the reactor refuses them for good.
    let refused = crate::reactors::refused_sign_up;
    let (status, out) = s
        .post(
            "/v1/projects/acme/ingest/orders",
            json!({"events": [refused("u-1"), refused("u-2")]}),
        )
        .await;
    assert_eq!(status, 202, "{out}");
    let parked = async || s.get("/v1/projects/acme/ingest/parked").await.1["parked"].clone();
    wait_for("two parked", Duration::from_secs(30), async || {
        parked().await.as_array().is_some_and(|p| p.len() == 2)
    })
    .await;
    let ids: Vec<i64> = parked()
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_i64().unwrap())
        .collect();
    // Without the reactor, a redrive appends.
    crate::reactors::unsubscribe(&s, STREAM, "welcome.v1").await;
    let shots = std::env::var("CONSOLE_SCREENSHOTS")
        .map(|d| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(d))
        .unwrap_or_else(|_| s.dir.path().to_path_buf());
    drive(json!({
        "url": s.url, "project": "acme", "token": "t-acme", "stream": "/orders",
        "parked": [ids[0], ids[1]], "reason": "has no userId", "shots": shots,
    }))
    .await;
    assert!(shots.join("console-ingest.png").is_file());
    let events = s.all_events(STREAM).await;
    let keys: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "user-signed-up")
        .map(|e| e["idempotencyKey"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["u-1"], "the redriven one landed");
    let discarded: Vec<&Value> = events
        .iter()
        .filter(|e| e["payload"]["ingest"]["parkedId"] == ids[1])
        .collect();
    assert_eq!(discarded.len(), 1, "one error-occurred line: {events:?}");
}
