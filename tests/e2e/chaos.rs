//! The chaos runner: mixed load against the real binary while a supervisor
//! SIGKILLs and restarts it at seeded random points; a history of what the
//! server acknowledged is checked afterwards against what it kept and what
//! its receivers saw.
//!
//! The load: appends with idempotency keys over shared streams (batches of
//! one to three events), compare-and-append on one stream per writer, a copy
//! chain of two hops, a webhook subscription to a loopback receiver, an ITX
//! subscription into the `kinds` component, a processor (`counter`), the
//! `effector` processor's webhook effects (each writer's an ordered group:
//! checked, their first executions in commit order), sign-ups whose welcome webhook
//! the `welcome` reactor commits with each event (checked: exactly one
//! effect per sign-up in the log, at its offset, none without its event),
//! HTTP ingest behind a reactor (`gate.v1`) whose component is deployed
//! mid-run and which then refuses some sign-ups for good (checked: every
//! accepted event appended once, in order, or parked once), live SSE
//! connections, and a poller of the processor's checkpoint.
//!
//! With several hosts (`several_hosts_under_kills_pauses_and_cuts_keep_the_history`,
//! on PostgreSQL) requests go to the hosts in turn, the supervisor also
//! SIGSTOPs hosts past their lease and cuts one off from PostgreSQL, and
//! a reader checks that no read that began after an append was
//! acknowledged misses it.
//!
//! CI runs the short profile (3 crashes). The long one:
//! `STREAMHOST_CHAOS_CRASHES=50 cargo test -p streamhost --test e2e chaos::mixed -- --nocapture`
//! (`STREAMHOST_CHAOS_SEED` picks the kill points and the load mix; a run
//! prints its seed). `STREAMHOST_CHAOS_FAULTS` injects storage faults
//! (`STREAMHOST_FAULTS` of the server); `STREAMHOST_CHAOS_SOAK_SECS=3600`
//! (with `STREAMHOST_CHAOS_CRASHES=0`) is the soak: a steady rate
//! (`STREAMHOST_CHAOS_RATE` operations per second per writer, 25 by
//! default) with the server's RSS sampled every 30 s. RELIABILITY.md lists
//! the invariants and the results.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::subscriptions::{subscribe, P};
use crate::support::{guest, poll_until, wait_for, Server, SseClient};

const CONFIG: &str = r#"
[delivery]
max-attempts = 50
backoff-base-ms = 10
backoff-max-ms = 200
timeout-ms = 3000

[effects]
max-attempts = 50
lease-ms = 5000
concurrency = 8
"#;

/// The type every subscription matches, and one they filter out.
/// How long one request may go without a definite answer (the server
/// killed and restarted meanwhile) before it counts as a violation.
const SEND_DEADLINE: Duration = Duration::from_secs(120);
const MATCHED: &str = "chaos.test/e";
const OTHER: &str = "chaos.test/other";
const EFFECTS_REQUESTED: &str = "events.example/effects-requested";
/// Shared append streams: a0 feeds the copy chain and the SSE clients, a1
/// the webhook, a2 the ITX receiver, a3 the counter processor.
const SHARED: u64 = 4;
const WRITERS: usize = 4;
const SSE_CLIENTS: usize = 2;
const FX: &str = "/chaos/fx";
/// Sign-ups, each committed with its welcome effect by the `welcome`
/// reactor (`welcome.v1`).
const USERS: &str = "/chaos/users";
const SIGNED_UP: &str = "user-signed-up";
/// Events accepted here reach `/chaos/in`.
const INGEST: &str = "/v1/projects/acme/ingest/chaos/in";
/// How long the system gets to deliver everything after the load stops.
const SETTLE: Duration = Duration::from_secs(120);

/// Seeded choices (SplitMix64): the kill points and each writer's mix.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One event of an acknowledged append.
struct Acked {
    stream: String,
    id: String,
    offset: u64,
}

/// What the clients did and saw.
#[derive(Default)]
struct History {
    acked: Vec<Acked>,
    /// Ids of the webhook effects that acknowledged appends asked for.
    effects: Vec<String>,
    /// Ids of the events accepted by `POST .../ingest/chaos/in`, in order.
    ingested: Vec<String>,
    /// Those of them the `gate.v1` reactor refuses for good (sign-ups
    /// without a userId): parked, never appended.
    ingest_refused: HashSet<String>,
    violations: Vec<String>,
    appends: u64,
    retries: u64,
    sse_connections: u64,
    sse_events: u64,
    checkpoints: u64,
    /// The highest acknowledged offset of each stream.
    heads: HashMap<String, u64>,
    /// Reads checked against what was acknowledged before they began.
    fresh_reads: u64,
}

/// What the load tasks share: the hosts' current URLs (each changes with
/// every restart; every request goes to the next host), the history, and
/// the phase flags.
struct Run {
    urls: RwLock<Vec<String>>,
    next_host: AtomicU64,
    client: reqwest::Client,
    history: Mutex<History>,
    /// The writers stop starting operations.
    stop: AtomicBool,
    /// The watchers (SSE, checkpoint poller) stop.
    done: AtomicBool,
    /// The furthest offset of `/chaos/a0` that each SSE client has seen.
    sse_seen: Vec<AtomicU64>,
}

impl Run {
    fn violation(&self, text: String) {
        eprintln!("chaos: VIOLATION {text}");
        self.history.lock().unwrap().violations.push(text);
    }

    /// The next host's URL (round robin: with several hosts, most requests
    /// meet a host that forwards them to the stream's owner).
    fn base(&self) -> String {
        let urls = self.urls.read().unwrap();
        let n = self.next_host.fetch_add(1, Ordering::Relaxed) as usize;
        urls[n % urls.len()].clone()
    }

    /// The highest offset of `stream` acknowledged so far.
    fn acked_head(&self, stream: &str) -> u64 {
        self.history
            .lock()
            .unwrap()
            .heads
            .get(stream)
            .copied()
            .unwrap_or(0)
    }

    /// Sends `body` to `path` until the answer is definite: a lost
    /// connection, a timeout, a 408, 429 or 5xx has an unknown outcome, and
    /// the same request (same idempotency keys) goes again. Returns a 2xx
    /// answer; any other is a violation.
    async fn send(&self, path: &str, body: &Value) -> Option<Value> {
        let deadline = Instant::now() + SEND_DEADLINE;
        loop {
            if Instant::now() >= deadline {
                self.violation(format!("{path}: no definite answer in {SEND_DEADLINE:?}"));
                return None;
            }
            let sent = self
                .client
                .post(format!("{}{path}", self.base()))
                .json(body)
                .send()
                .await;
            let answer = match sent {
                Ok(r) => {
                    let status = r.status().as_u16();
                    r.json::<Value>().await.ok().map(|v| (status, v))
                }
                Err(_) => None,
            };
            match answer {
                Some((status, out)) if (200..300).contains(&status) => return Some(out),
                Some((status, out))
                    if (400..500).contains(&status) && status != 408 && status != 429 =>
                {
                    self.violation(format!("{path}: refused {status} {out}"));
                    return None;
                }
                _ => {
                    self.history.lock().unwrap().retries += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }

    /// Appends `events` to `stream` (see [`Run::send`]). Returns the
    /// committed offsets, after checking that the answer holds the events
    /// asked for.
    async fn append(&self, stream: &str, events: Vec<Value>) -> Option<Vec<u64>> {
        self.history.lock().unwrap().appends += 1;
        let out = self
            .send(&format!("{P}{stream}:append"), &json!({ "events": events }))
            .await?;
        let committed = out["events"].as_array().cloned().unwrap_or_default();
        if committed.len() != events.len() {
            self.violation(format!(
                "{stream}: {} events asked, answer {out}",
                events.len()
            ));
            return None;
        }
        let mut offsets = Vec::new();
        for (asked, got) in events.iter().zip(&committed) {
            let id = asked["payload"]["id"].as_str().unwrap_or_default();
            if got["payload"]["id"] != asked["payload"]["id"] {
                self.violation(format!("{stream}: asked to append {id}, answer {got}"));
                return None;
            }
            let offset = got["offset"].as_u64().unwrap_or_default();
            offsets.push(offset);
            let mut h = self.history.lock().unwrap();
            h.acked.push(Acked {
                stream: stream.to_string(),
                id: id.to_string(),
                offset,
            });
            let head = h.heads.entry(stream.to_string()).or_default();
            *head = (*head).max(offset);
        }
        Some(offsets)
    }
}

/// A writer: appends to the shared streams, compare-and-appends to its own
/// stream, and asks the effector for webhook effects, until told to stop.
async fn writer(run: Arc<Run>, w: usize, seed: u64, fx_url: String, rate: Option<u64>) {
    let mut rng = Rng(seed ^ (0x5851_F42D_4C95_7F2D_u64.wrapping_mul(w as u64 + 1)));
    let mut cas_next: Option<u64> = None;
    let mut i = 0u64;
    // A steady rate (operations per second) for the soak; flat out otherwise.
    let mut pace = rate.map(|r| {
        let mut t = tokio::time::interval(Duration::from_secs_f64(1.0 / r.max(1) as f64));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    while !run.stop.load(Ordering::SeqCst) {
        if let Some(t) = &mut pace {
            t.tick().await;
        }
        i += 1;
        let roll = rng.below(100);
        if roll < 60 {
            let a = rng.below(SHARED);
            let stream = format!("/chaos/a{a}");
            let events = (0..1 + rng.below(3))
                .map(|j| {
                    let id = format!("w{w}-{i}-{j}");
                    let t = if rng.below(10) == 0 { OTHER } else { MATCHED };
                    let mut e = json!({"type": t, "payload": {"id": id}, "idempotencyKey": id});
                    // One in 200 on a1: the flaky receiver refuses it, so
                    // the skip policy skips it (rare enough that three in a
                    // row, which halt, do not happen).
                    if a == 1 && rng.below(200) == 0 {
                        e["payload"]["bad"] = json!(true);
                    }
                    e
                })
                .collect();
            run.append(&stream, events).await;
        } else if roll < 85 {
            // One writer per stream, so the expected offset is known once
            // the first append told it.
            let id = format!("w{w}-{i}-cas");
            let mut event = json!({"type": MATCHED, "payload": {"id": id}, "idempotencyKey": id});
            if let Some(next) = cas_next {
                event["offset"] = json!(next);
            }
            if let Some(offsets) = run.append(&format!("/chaos/cas{w}"), vec![event]).await {
                cas_next = Some(offsets[0] + 1);
            }
        } else if roll < 90 {
            let ids: Vec<String> = (0..1 + rng.below(3))
                .map(|j| format!("in-w{w}-{i}-{j}"))
                .collect();
            // One in five is a sign-up the `gate.v1` reactor on /chaos/in
            // sees: refused for now until its component is deployed
            // mid-run, then accepted, or (without a userId) refused for good.
            let mut refused = Vec::new();
            let events: Vec<Value> = ids
                .iter()
                .map(|id| {
                    if rng.below(5) != 0 {
                        return json!({"type": MATCHED, "payload": {"id": id}, "idempotencyKey": id});
                    }
                    let gate_url = fx_url.replace("/fx", "/gate");
                    let mut payload = json!({"id": id, "email": "someone@example.com", "welcomeUrl": gate_url});
                    if rng.below(2) == 0 {
                        refused.push(id.clone());
                    } else {
                        payload["userId"] = json!(id);
                    }
                    json!({"type": SIGNED_UP, "payload": payload, "idempotencyKey": id})
                })
                .collect();
            let body = json!({ "events": events });
            if let Some(out) = run.send(INGEST, &body).await {
                if out["accepted"] == ids.len() {
                    let mut h = run.history.lock().unwrap();
                    h.ingested.extend(ids);
                    h.ingest_refused.extend(refused);
                } else {
                    run.violation(format!("ingest of {ids:?} answered {out}"));
                }
            }
        } else if rng.below(2) == 0 {
            let id = format!("su-w{w}-{i}");
            let welcome_url = fx_url.replace("/fx", "/welcome");
            let event = json!({"type": SIGNED_UP, "idempotencyKey": id, "payload": {"id": id,
                "userId": id, "email": "someone@example.com", "welcomeUrl": welcome_url}});
            run.append(USERS, vec![event]).await;
        } else {
            // Each writer's effects are one ordered group: they run in the
            // order its appends committed (checked after the run).
            let id = format!("fx-w{w}-{i}");
            let event = json!({"type": EFFECTS_REQUESTED, "idempotencyKey": id, "payload": {"id": id,
                "effects": [{"key": id, "group": format!("w{w}"),
                    "webhook": {"url": fx_url, "body": {"id": id}}}]}});
            if run.append(FX, vec![event]).await.is_some() {
                run.history.lock().unwrap().effects.push(id);
            }
        }
    }
}

/// A live connection to `/chaos/a0`, reopened after every crash with
/// `replayAfterOffset` at the last offset seen: within a connection the
/// offsets must follow each other with no gap and no repeat.
async fn sse_client(run: Arc<Run>, n: usize) {
    let mut last = 0u64;
    while !run.done.load(Ordering::SeqCst) {
        let path = format!("{P}/chaos/a0:connect?replayAfterOffset={last}&state=false");
        let mut client = match SseClient::open_at(&run.base(), &path).await {
            None => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Some(Err((status, body))) => {
                if status < 500 {
                    run.violation(format!(
                        "SSE client {n}: reconnect after {last}: {status} {body}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Some(Ok(c)) => c,
        };
        run.history.lock().unwrap().sse_connections += 1;
        while !run.done.load(Ordering::SeqCst) {
            let Some((kind, batch)) = client.next_within(Duration::from_secs(1)).await else {
                break; // the server went away (or was quiet): reconnect
            };
            if kind != "batch" {
                continue;
            }
            for e in batch["events"].as_array().into_iter().flatten() {
                let offset = e["offset"].as_u64().unwrap_or_default();
                if offset != last + 1 {
                    run.violation(format!(
                        "SSE client {n}: offset {offset} after {last} within one connection"
                    ));
                }
                last = last.max(offset);
                run.history.lock().unwrap().sse_events += 1;
            }
            run.sse_seen[n].store(last, Ordering::SeqCst);
        }
    }
}

/// Reads the shared streams through every host in turn: a read that began
/// after an append was acknowledged must include it (a host may refuse,
/// `503`, but never answer from a stale view).
async fn fresh_reader(run: Arc<Run>) {
    let mut n = 0u64;
    let mut pace = tokio::time::interval(Duration::from_millis(10));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !run.done.load(Ordering::SeqCst) {
        n += 1;
        // A steady pace of reads (not a wait for anything).
        pace.tick().await;
        let stream = format!("/chaos/a{}", n % SHARED);
        let acked = run.acked_head(&stream);
        if acked == 0 {
            continue;
        }
        let url = format!(
            "{}{P}{stream}:events?afterOffset={}&limit=1",
            run.base(),
            acked - 1
        );
        if let Ok(r) = run.client.get(url).send().await {
            if r.status() == 200 {
                if let Ok(page) = r.json::<Value>().await {
                    let first = page["events"][0]["offset"].as_u64();
                    if first != Some(acked) {
                        run.violation(format!(
                            "{stream}: a read that began after offset {acked} was acknowledged \
                             answered {page}"
                        ));
                    }
                    run.history.lock().unwrap().fresh_reads += 1;
                }
            }
        }
    }
}

/// Polls the counter's checkpoint on `/chaos/a3`: it must never go back.
async fn checkpoint_poller(run: Arc<Run>) {
    let mut highest = 0u64;
    while !run.done.load(Ordering::SeqCst) {
        let url = format!("{}{P}/chaos/a3:processors/counter", run.base());
        if let Ok(r) = run.client.get(url).send().await {
            if r.status() == 200 {
                if let Ok(p) = r.json::<Value>().await {
                    let at = p["checkpointOffset"].as_u64().unwrap_or_default();
                    if at < highest {
                        run.violation(format!("the checkpoint went back from {highest} to {at}"));
                    }
                    highest = highest.max(at);
                    run.history.lock().unwrap().checkpoints += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The loopback receiver of webhook deliveries (`/hook`; `/flaky`, which
/// answers 422 to events marked bad) and of webhook effects (`/fx`, with
/// their `Idempotency-Key`).
#[derive(Default)]
struct Received {
    hook: Vec<Value>,
    flaky: Vec<Value>,
    fx: Vec<(Option<String>, Value)>,
    welcome: Vec<(Option<String>, Value)>,
    /// The `gate.v1` reactor's effects (its sign-ups arrive by ingest).
    gate: usize,
}

async fn receiver() -> (String, Arc<Mutex<Received>>) {
    let got: Arc<Mutex<Received>> = Arc::default();
    async fn hook(State(got): State<Arc<Mutex<Received>>>, Json(body): Json<Value>) -> StatusCode {
        got.lock().unwrap().hook.push(body);
        StatusCode::OK
    }
    async fn flaky(State(got): State<Arc<Mutex<Received>>>, Json(body): Json<Value>) -> StatusCode {
        let bad = body["event"]["payload"]["bad"] == true;
        got.lock().unwrap().flaky.push(body);
        if bad {
            StatusCode::UNPROCESSABLE_ENTITY
        } else {
            StatusCode::OK
        }
    }
    /// An effect's POST: its `Idempotency-Key` and body.
    fn keyed(headers: &HeaderMap, body: Value) -> (Option<String>, Value) {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        (key, body)
    }
    async fn fx(
        State(got): State<Arc<Mutex<Received>>>,
        headers: HeaderMap,
        Json(body): Json<Value>,
    ) -> StatusCode {
        got.lock().unwrap().fx.push(keyed(&headers, body));
        StatusCode::OK
    }
    async fn welcome(
        State(got): State<Arc<Mutex<Received>>>,
        headers: HeaderMap,
        Json(body): Json<Value>,
    ) -> StatusCode {
        got.lock().unwrap().welcome.push(keyed(&headers, body));
        StatusCode::OK
    }
    async fn gate(State(got): State<Arc<Mutex<Received>>>) -> StatusCode {
        got.lock().unwrap().gate += 1;
        StatusCode::OK
    }
    let app = Router::new()
        .route("/gate", post(gate))
        .route("/hook", post(hook))
        .route("/flaky", post(flaky))
        .route("/fx", post(fx))
        .route("/welcome", post(welcome))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, got)
}

fn configured(key: &str, receiver: Value, filter: bool) -> Value {
    let mut payload = json!({"subscriptionKey": key, "receiver": receiver});
    if filter {
        payload["filter"] = json!({"eventTypes": [MATCHED]});
    }
    json!({"events": [{"type": "events.iterate.com/stream/subscription-configured", "payload": payload}]})
}

/// Deploys the components and configures every subscription before any load.
async fn set_up(s: &Server, receiver_base: &str) {
    for (name, bytes) in [
        ("counter", guest("counter")),
        ("kinds", guest("kinds")),
        ("effector", guest("effector")),
        ("welcome", guest("welcome")),
    ] {
        let (status, out) = s.deploy("acme", name, bytes).await;
        assert_eq!(status, 200, "{out}");
    }
    subscribe(
        s,
        "/chaos/copy1",
        json!({"sourceStreamPath": "/chaos/a0", "subscriptionKey": "c1", "start": "beginning",
               "filter": {"eventTypes": [MATCHED]}}),
    )
    .await;
    subscribe(
        s,
        "/chaos/copy2",
        json!({"sourceStreamPath": "/chaos/copy1", "subscriptionKey": "c2", "start": "beginning",
               "filter": {"eventTypes": [MATCHED]}}),
    )
    .await;
    let start = json!({"start": "beginning", "onFailingEvent": "halt"});
    for (stream, body) in [
        (
            "/chaos/a1",
            configured(
                "hook",
                json!({"action": "webhook-post", "url": format!("{receiver_base}/hook"), "delivery": start}),
                true,
            ),
        ),
        (
            "/chaos/a1",
            configured(
                "flaky",
                json!({"action": "webhook-post", "url": format!("{receiver_base}/flaky"),
                       "delivery": {"start": "beginning", "onFailingEvent": "skip"}}),
                true,
            ),
        ),
        (
            "/chaos/a2",
            configured(
                "itx",
                json!({"action": "itx-call", "expression": ["components", ["get", "kinds"], "processEventBatch"],
                       "delivery": start}),
                true,
            ),
        ),
        (
            "/chaos/a3",
            configured(
                "count",
                json!({"action": "processor-wake", "expression": ["components", ["get", "counter"], "wake"]}),
                false,
            ),
        ),
        (
            USERS,
            json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": "welcome.v1", "filter": {"eventTypes": [SIGNED_UP]},
                    "receiver": {"action": "reactor",
                        "expression": ["components", ["get", "welcome"], "react"]}}}]}),
        ),
        // A reactor on the ingest stream whose component ("gate") is
        // deployed mid-run: until then it refuses for now.
        (
            "/chaos/in",
            json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": "gate.v1", "filter": {"eventTypes": [SIGNED_UP]},
                    "receiver": {"action": "reactor",
                        "expression": ["components", ["get", "gate"], "react"]}}}]}),
        ),
        (
            FX,
            configured(
                "fx",
                json!({"action": "processor-wake", "expression": ["components", ["get", "effector"], "wake"]}),
                false,
            ),
        ),
    ] {
        let (status, out) = s.post(&format!("{P}{stream}:append"), body).await;
        assert_eq!(status, 200, "{out}");
    }
}

/// The ids of the ingested events in `/chaos/in` (plain ones and sign-ups).
fn ingest_ids(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == MATCHED || e["type"] == SIGNED_UP)
        .filter_map(|e| e["payload"]["id"].as_str().map(str::to_string))
        .collect()
}

/// The ids of every parked ingest event of project acme, page by page.
async fn parked_ids(s: &Server) -> Vec<String> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let (status, page) = s
            .get(&format!(
                "/v1/projects/acme/ingest/parked?afterId={after}&limit=1000"
            ))
            .await;
        assert_eq!(status, 200, "{page}");
        for p in page["parked"].as_array().into_iter().flatten() {
            out.push(
                p["event"]["payload"]["id"]
                    .as_str()
                    .unwrap_or("?")
                    .to_string(),
            );
        }
        match page["nextAfterId"].as_i64() {
            Some(next) => after = next,
            None => return out,
        }
    }
}

/// Parking: every event refused for good parked exactly once, nothing else.
fn check_parked(refused: &HashSet<String>, parked: &[String]) -> Vec<String> {
    let mut violations = Vec::new();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for id in parked {
        *count.entry(id).or_default() += 1;
    }
    for id in refused {
        if count.get(id.as_str()) != Some(&1) {
            violations.push(format!(
                "ingest: {id} refused for good, parked {} times",
                count.get(id.as_str()).unwrap_or(&0)
            ));
        }
    }
    for id in parked.iter().filter(|id| !refused.contains(*id)) {
        violations.push(format!("ingest: {id} parked, never refused for good"));
    }
    violations
}

fn ids(events: &[Value], of_type: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == of_type)
        .map(|e| e["payload"]["id"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn offsets_of(events: &[Value], of_type: &str) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e["type"] == of_type)
        .map(|e| e["offset"].as_u64().unwrap())
        .collect()
}

/// The offsets of every batch the kinds guest printed, in order.
fn itx_offsets(logs: &str) -> Vec<u64> {
    logs.lines()
        .filter_map(|l| l.split("itx batch delivery-id=").nth(1))
        .filter_map(|rest| rest.split("offsets=").nth(1)?.split(' ').next())
        .flat_map(|list| {
            list.split(',')
                .filter_map(|o| o.parse().ok())
                .collect::<Vec<u64>>()
        })
        .collect()
}

/// The violations of one stream's log against the appends acknowledged on
/// it (event id, offset): offsets dense from 1; every acknowledged event
/// exactly once, at its offset; no event that was never acknowledged.
fn check_log(stream: &str, acked: &[(String, u64)], log: &[Value]) -> Vec<String> {
    let mut violations = Vec::new();
    for (k, e) in log.iter().enumerate() {
        if e["offset"].as_u64() != Some(k as u64 + 1) {
            violations.push(format!(
                "{stream}: offset {} at position {}",
                e["offset"],
                k + 1
            ));
        }
    }
    let mut at: HashMap<&str, Vec<u64>> = HashMap::new();
    for e in log {
        if let Some(id) = e["payload"]["id"].as_str() {
            at.entry(id)
                .or_default()
                .push(e["offset"].as_u64().unwrap_or_default());
        }
    }
    let acked_ids: HashSet<&str> = acked.iter().map(|(id, _)| id.as_str()).collect();
    for (id, offset) in acked {
        match at.get(id.as_str()).map(Vec::as_slice) {
            Some([o]) if o == offset => {}
            other => violations.push(format!(
                "{stream}: {id} acknowledged at {offset}, found at {other:?}"
            )),
        }
    }
    let mut unacked: Vec<_> = at
        .iter()
        .filter(|(id, _)| !acked_ids.contains(*id))
        .collect();
    unacked.sort();
    for (id, offsets) in unacked {
        violations.push(format!(
            "{stream}: {id} at {offsets:?} was never acknowledged"
        ));
    }
    violations
}

/// Ingest: every accepted id exactly once in the stream, no other id, and
/// each producer's ids (`in-w{W}-...`) in the order they were accepted.
fn check_ingest(accepted: &[String], stored: &[String]) -> Vec<String> {
    let mut violations = Vec::new();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for id in stored {
        *count.entry(id).or_default() += 1;
    }
    for id in accepted {
        match count.get(id.as_str()) {
            Some(1) => {}
            n => violations.push(format!(
                "ingest: {id} accepted, stored {} times",
                n.unwrap_or(&0)
            )),
        }
    }
    let wanted: HashSet<&str> = accepted.iter().map(String::as_str).collect();
    for id in stored.iter().filter(|id| !wanted.contains(id.as_str())) {
        violations.push(format!("ingest: {id} stored, never accepted"));
    }
    let producer = |id: &str| id.split('-').nth(1).unwrap_or_default().to_string();
    let mut order: HashMap<String, Vec<&str>> = HashMap::new();
    for id in accepted {
        order.entry(producer(id)).or_default().push(id);
    }
    let mut seen: HashMap<String, Vec<&str>> = HashMap::new();
    let mut once = HashSet::new();
    for id in stored
        .iter()
        .filter(|id| wanted.contains(id.as_str()) && once.insert(id.as_str()))
    {
        seen.entry(producer(id)).or_default().push(id);
    }
    for (p, accepted_order) in &order {
        if seen.get(p) != Some(accepted_order) {
            violations.push(format!(
                "ingest: producer {p} stored out of the accepted order"
            ));
        }
    }
    violations
}

/// At-least-once delivery in order: the first delivery of each offset, in
/// arrival order, must be exactly the source's matching offsets.
fn check_deliveries(what: &str, delivered: &[u64], expected: &[u64]) -> Option<String> {
    let mut seen = HashSet::new();
    let first: Vec<u64> = delivered
        .iter()
        .copied()
        .filter(|o| seen.insert(*o))
        .collect();
    (first != expected)
        .then(|| format!("{what}: first deliveries {first:?}, source order {expected:?}"))
}

fn env(k: &str) -> Option<u64> {
    std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_load_survives_sigkill_loops_and_the_history_checks_out() {
    let crashes = env("STREAMHOST_CHAOS_CRASHES").unwrap_or(3);
    chaos(1, crashes, 0, 0).await;
}

/// Several hosts on one PostgreSQL (runs in the PostgreSQL pass): the same
/// load through three hosts in turn while the supervisor SIGKILLs hosts,
/// SIGSTOPs one past its lease and lets it go on, and cuts one off from
/// PostgreSQL (a loopback proxy) and heals it. CI runs a short profile;
/// the long one: `STREAMHOST_CHAOS_CLUSTER_CRASHES=20
/// STREAMHOST_CHAOS_CLUSTER_PAUSES=10 STREAMHOST_CHAOS_CLUSTER_CUTS=5`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_hosts_under_kills_pauses_and_cuts_keep_the_history() {
    if crate::cluster::on_sqlite() {
        return;
    }
    let crashes = env("STREAMHOST_CHAOS_CLUSTER_CRASHES").unwrap_or(2);
    let pauses = env("STREAMHOST_CHAOS_CLUSTER_PAUSES").unwrap_or(1);
    let cuts = env("STREAMHOST_CHAOS_CLUSTER_CUTS").unwrap_or(1);
    chaos(3, crashes, pauses, cuts).await;
}

/// Several hosts' leases in the chaos runs: short, so faults move streams.
const CLUSTER_LEASE_MS: u64 = 1500;

/// One fault of the supervisor's schedule.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// SIGKILL and start again.
    Kill,
    /// SIGSTOP past the lease, then SIGCONT.
    Pause,
    /// Cut off from PostgreSQL past the lease, then healed.
    Cut,
}

/// The chaos run: `hosts` servers (one: SQLite or PostgreSQL as the suite
/// runs; several: a cluster on PostgreSQL, host 0 behind a cuttable
/// proxy), with `crashes` kills, `pauses` pauses and `cuts` cuts at seeded
/// points of the load.
async fn chaos(hosts: usize, crashes: u64, pauses: u64, cuts: u64) {
    let seed = env("STREAMHOST_CHAOS_SEED").unwrap_or(1);
    // The soak: steady load for this long, the server's RSS sampled.
    let soak = env("STREAMHOST_CHAOS_SOAK_SECS").map(Duration::from_secs);
    let rate = env("STREAMHOST_CHAOS_RATE").or(soak.map(|_| 25));
    println!("chaos: seed {seed}, {hosts} hosts, {crashes} crashes, {pauses} pauses, {cuts} cuts");
    let (receiver_base, received) = receiver().await;
    let config = if hosts > 1 {
        format!("{CONFIG}\n[cluster]\nlease-ms = {CLUSTER_LEASE_MS}\ndb-timeout-ms = 1000\n")
    } else {
        CONFIG.to_string()
    };
    let mut first = Server::unstarted(None, Some(&config), &[]);
    // Storage faults for the whole run (see the server's storage::faults).
    if let Ok(faults) = std::env::var("STREAMHOST_CHAOS_FAULTS") {
        println!("chaos: storage faults {faults}");
        first.env.push(("STREAMHOST_FAULTS".into(), faults));
    }
    first.launch();
    let proxy = (hosts > 1).then(|| crate::support::TcpCut::start(crate::cluster::postgres_port()));
    let mut servers = vec![first];
    for _ in 1..hosts {
        let joined = match (&proxy, servers.len()) {
            (Some(proxy), 1) => Server::joining_through(&servers[0], Some(&config), proxy),
            _ => Server::joining(&servers[0], Some(&config)),
        };
        servers.push(joined);
    }
    set_up(&servers[0], &receiver_base).await;
    let run = Arc::new(Run {
        urls: RwLock::new(servers.iter().map(|s| s.url.clone()).collect()),
        next_host: AtomicU64::new(0),
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        history: Mutex::default(),
        stop: AtomicBool::new(false),
        done: AtomicBool::new(false),
        sse_seen: (0..SSE_CLIENTS).map(|_| AtomicU64::new(0)).collect(),
    });
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let fx_url = format!("{receiver_base}/fx");
            tokio::spawn(writer(run.clone(), w, seed, fx_url, rate))
        })
        .collect();
    let mut watchers: Vec<_> = (0..SSE_CLIENTS)
        .map(|n| tokio::spawn(sse_client(run.clone(), n)))
        .collect();
    watchers.push(tokio::spawn(checkpoint_poller(run.clone())));
    watchers.push(tokio::spawn(fresh_reader(run.clone())));

    // The supervisor: faults at seeded points while the load runs.
    let started = Instant::now();
    let mut rng = Rng(seed);
    let mut schedule: Vec<Fault> = std::iter::repeat_n(Fault::Kill, crashes as usize)
        .chain(std::iter::repeat_n(Fault::Pause, pauses as usize))
        .chain(std::iter::repeat_n(Fault::Cut, cuts as usize))
        .collect();
    for i in (1..schedule.len()).rev() {
        schedule.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let total = schedule.len();
    // Mid-run, the gate reactor's component is deployed (ingest held on it
    // goes on); with no faults scheduled, once the load has run a while.
    let deploy_gate = async |servers: &[Server]| {
        let (status, out) = servers[0].deploy("acme", "gate", guest("welcome")).await;
        assert_eq!(status, 200, "{out}");
        println!("chaos: the gate reactor's component deployed");
    };
    if total == 0 {
        // With no faults to run it between: once some ingest was accepted.
        wait_for("some ingest accepted", SETTLE, async || {
            run.history.lock().unwrap().ingested.len() >= 20
        })
        .await;
        deploy_gate(&servers).await;
    }
    for (n, fault) in schedule.into_iter().enumerate() {
        if n == total / 2 {
            deploy_gate(&servers).await;
        }
        let after = 200 + rng.below(1300);
        let host = rng.below(hosts as u64) as usize;
        // Not a wait for a condition: the fault points are the schedule itself.
        tokio::time::sleep(Duration::from_millis(after)).await;
        let past_lease = Duration::from_millis(CLUSTER_LEASE_MS + 300 + rng.below(1200));
        match fault {
            Fault::Kill => {
                tokio::task::block_in_place(|| servers[host].restart());
                run.urls.write().unwrap()[host] = servers[host].url.clone();
            }
            // A pause or a cut lasts past the lease (the fault's length is
            // the schedule itself, as the kill points are), so another host
            // may take the streams over.
            Fault::Pause => {
                servers[host].signal("STOP");
                tokio::time::sleep(past_lease).await;
                servers[host].signal("CONT");
            }
            Fault::Cut => {
                let proxy = proxy.as_ref().expect("cuts need several hosts");
                proxy.cut();
                tokio::time::sleep(past_lease).await;
                proxy.heal();
            }
        }
        let h = run.history.lock().unwrap();
        println!(
            "chaos: fault {}/{total}: {fault:?} of host {host} {after} ms into its round; {} events acknowledged, {} retried requests so far",
            n + 1,
            h.acked.len(),
            h.retries
        );
    }
    let server = &mut servers[0];
    if let Some(length) = soak {
        const MIB: f64 = 1024.0 * 1024.0;
        let rss_mib = |s: &Server| s.rss_bytes() as f64 / MIB;
        let mut samples = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_secs(30));
        while started.elapsed() < length {
            tick.tick().await;
            let rss = rss_mib(server);
            samples.push(rss);
            let sqlite = server.metric("streamhost_sqlite_memory_bytes").await as f64 / MIB;
            let acked = run.history.lock().unwrap().acked.len();
            println!(
                "soak: {:>5} s  rss {rss:7.1} MiB  sqlite {sqlite:5.1} MiB  {acked} events acknowledged",
                started.elapsed().as_secs()
            );
        }
        let tenth = samples[samples.len() / 10];
        let max = samples.iter().copied().fold(0.0, f64::max);
        println!(
            "soak: rss first {:.1} MiB, at 10 % {tenth:.1} MiB, last {:.1} MiB, max {max:.1} MiB over {} samples",
            samples[0],
            samples[samples.len() - 1],
            samples.len()
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    run.stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.await.unwrap();
    }
    let load_time = started.elapsed();

    // Let everything be delivered, then compare.
    let server = &servers[0];
    let s = server;
    // What every host logged (ITX deliveries run on the stream's owner),
    // merged in time order (each line starts with its RFC 3339 time).
    let all_logs = || {
        let mut lines: Vec<String> = servers
            .iter()
            .flat_map(|s| s.all_logs().lines().map(str::to_string).collect::<Vec<_>>())
            .collect();
        if servers.len() > 1 {
            lines.sort_by(|a, b| a.split(' ').next().cmp(&b.split(' ').next()));
        }
        lines.join("\n")
    };
    let a0 = s.all_events(&format!("{P}/chaos/a0")).await;
    let matched0 = ids(&a0, MATCHED);
    wait_for("the copy chain to catch up", SETTLE, async || {
        ids(&s.all_events(&format!("{P}/chaos/copy2")).await, MATCHED).len() >= matched0.len()
    })
    .await;
    let a1 = s.all_events(&format!("{P}/chaos/a1")).await;
    let expected_hook = offsets_of(&a1, MATCHED);
    // The event offsets of what a webhook receiver got, in arrival order.
    let posted = |posts: &[Value]| -> Vec<u64> {
        posts
            .iter()
            .map(|p| p["event"]["offset"].as_u64().unwrap_or_default())
            .collect()
    };
    let hook_offsets = || posted(&received.lock().unwrap().hook);
    let flaky_offsets = || posted(&received.lock().unwrap().flaky);
    let bad: HashSet<u64> = a1
        .iter()
        .filter(|e| e["type"] == MATCHED && e["payload"]["bad"] == true)
        .map(|e| e["offset"].as_u64().unwrap())
        .collect();
    let skip_lines = async || -> Vec<Value> {
        s.all_events(&format!("{P}/chaos/a1"))
            .await
            .into_iter()
            .filter(|e| e["type"] == "events.iterate.com/stream/error-occurred")
            .collect()
    };
    wait_for("every webhook delivery and skip", SETTLE, async || {
        let have: HashSet<u64> = hook_offsets().into_iter().chain(flaky_offsets()).collect();
        let skipped: HashSet<u64> = skip_lines()
            .await
            .iter()
            .filter_map(|e| e["payload"]["offset"].as_u64())
            .collect();
        expected_hook.iter().all(|o| have.contains(o))
            && flaky_offsets().iter().collect::<HashSet<_>>().len() >= expected_hook.len()
            && bad.is_subset(&skipped)
    })
    .await;
    let a2 = s.all_events(&format!("{P}/chaos/a2")).await;
    let expected_itx = offsets_of(&a2, MATCHED);
    wait_for("every ITX delivery", SETTLE, async || {
        let have: HashSet<u64> = itx_offsets(&all_logs()).into_iter().collect();
        expected_itx.iter().all(|o| have.contains(o))
    })
    .await;
    let a3 = s.all_events(&format!("{P}/chaos/a3")).await;
    let head3 = a3.last().map_or(0, |e| e["offset"].as_u64().unwrap());
    wait_for("the counter to catch up", SETTLE, async || {
        let (status, p) = s.get(&format!("{P}/chaos/a3:processors/counter")).await;
        status == 200 && p["checkpointOffset"] == head3
    })
    .await;
    let wanted_effects: HashSet<String> = run
        .history
        .lock()
        .unwrap()
        .effects
        .iter()
        .cloned()
        .collect();
    wait_for("every webhook effect", SETTLE, async || {
        let got = received.lock().unwrap();
        let have: HashSet<&str> = got
            .fx
            .iter()
            .filter_map(|(_, b)| b["id"].as_str())
            .collect();
        wanted_effects.iter().all(|id| have.contains(id.as_str()))
    })
    .await;
    // Every sign-up in the log has its welcome effect, which ran.
    let signed_up: HashMap<String, u64> = s
        .all_events(&format!("{P}{USERS}"))
        .await
        .iter()
        .filter(|e| e["type"] == SIGNED_UP)
        .map(|e| {
            (
                format!(
                    "welcome:{}",
                    e["payload"]["userId"].as_str().unwrap_or_default()
                ),
                e["offset"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    wait_for("every welcome effect", SETTLE, async || {
        let got = received.lock().unwrap();
        let have: HashSet<String> = got
            .welcome
            .iter()
            .filter_map(|(_, b)| b["userId"].as_str())
            .map(|u| format!("welcome:{u}"))
            .collect();
        signed_up.keys().all(|k| have.contains(k))
    })
    .await;
    let ingested: Vec<String> = run.history.lock().unwrap().ingested.clone();
    let refused: HashSet<String> = run.history.lock().unwrap().ingest_refused.clone();
    wait_for(
        "every accepted ingest event appended or parked",
        SETTLE,
        async || {
            let stored = ingest_ids(&s.all_events(&format!("{P}/chaos/in")).await);
            let parked = parked_ids(s).await;
            let done: HashSet<&str> = stored.iter().chain(&parked).map(String::as_str).collect();
            ingested.iter().all(|id| done.contains(id.as_str()))
        },
    )
    .await;
    let head0 = a0.last().map_or(0, |e| e["offset"].as_u64().unwrap());
    wait_for("the SSE clients to reach the head", SETTLE, async || {
        run.sse_seen
            .iter()
            .all(|seen| seen.load(Ordering::SeqCst) >= head0)
    })
    .await;
    run.done.store(true, Ordering::SeqCst);
    for w in watchers {
        w.await.unwrap();
    }

    // 1. Every acknowledged append is there exactly once, at its offset;
    //    offsets are dense; nothing appears that was not acknowledged.
    let mut acked_by_stream: HashMap<String, Vec<(String, u64)>> = HashMap::new();
    for a in &run.history.lock().unwrap().acked {
        acked_by_stream
            .entry(a.stream.clone())
            .or_default()
            .push((a.id.clone(), a.offset));
    }
    let mut logs: HashMap<String, Vec<Value>> = HashMap::new();
    for stream in acked_by_stream.keys() {
        logs.insert(stream.clone(), s.all_events(&format!("{P}{stream}")).await);
    }
    for (stream, acked) in &acked_by_stream {
        for v in check_log(stream, acked, &logs[stream]) {
            run.violation(v);
        }
    }
    // 2. Every matching event copied exactly once, in order, at each hop.
    let copy1 = s.all_events(&format!("{P}/chaos/copy1")).await;
    let copy2 = s.all_events(&format!("{P}/chaos/copy2")).await;
    if ids(&copy1, MATCHED) != matched0 {
        run.violation(format!(
            "copy hop 1: {} copies of {} matching events, not the same sequence",
            ids(&copy1, MATCHED).len(),
            matched0.len()
        ));
    }
    if ids(&copy2, MATCHED) != ids(&copy1, MATCHED) {
        run.violation(format!(
            "copy hop 2: {} copies of {} events, not the same sequence",
            ids(&copy2, MATCHED).len(),
            ids(&copy1, MATCHED).len()
        ));
    }
    // 3. Webhook and ITX deliveries: each at least once, first deliveries in
    //    source order, nothing else delivered, nothing skipped.
    for (what, delivered, expected) in [
        ("webhook", hook_offsets(), &expected_hook),
        ("webhook with skips", flaky_offsets(), &expected_hook),
        ("ITX", itx_offsets(&all_logs()), &expected_itx),
    ] {
        if let Some(v) = check_deliveries(what, &delivered, expected) {
            run.violation(v);
        }
    }
    // Skipped: exactly the events the receiver refused, each with its
    // error line (a crash between the line and the cursor may repeat one);
    // no halt.
    let lines = skip_lines().await;
    let skipped: HashSet<u64> = lines
        .iter()
        .filter(|e| e["payload"]["subscriptionKey"] == "flaky")
        .filter_map(|e| e["payload"]["offset"].as_u64())
        .collect();
    if skipped != bad
        || lines
            .iter()
            .any(|e| e["payload"]["subscriptionKey"] != "flaky")
    {
        run.violation(format!(
            "a1: skipped {skipped:?}, refused {bad:?}; error lines {lines:?}"
        ));
    }
    let a2_lines = s.all_events(&format!("{P}/chaos/a2")).await;
    if a2_lines
        .iter()
        .any(|e| e["type"] == "events.iterate.com/stream/error-occurred")
    {
        run.violation("/chaos/a2: an error line (a skip or a halt)".into());
    }
    // 3b. Every accepted ingest event reached its stream once, each
    //     producer's in the order accepted; nothing else did.
    //     A sign-up the gate reactor refuses for good is parked instead
    //     (once, and only those are).
    let log_in = s.all_events(&format!("{P}/chaos/in")).await;
    let parked = parked_ids(s).await;
    for v in check_parked(&refused, &parked) {
        run.violation(v);
    }
    let appendable: Vec<String> = ingested
        .iter()
        .filter(|id| !refused.contains(*id))
        .cloned()
        .collect();
    for v in check_ingest(&appendable, &ingest_ids(&log_in)) {
        run.violation(v);
    }
    // 4. Processor state = fold(log). With several hosts the stream's
    //    owner may be one still coming back from the last kill: its `503`
    //    (the owner did not answer) is retried as a client would, until the
    //    deadline; any other answer is checked.
    let mut verified = Value::Null;
    poll_until(SETTLE, async || {
        let (status, answer) = s
            .post(
                &format!("{P}/chaos/a3:verifyProcessor"),
                json!({"component": "counter"}),
            )
            .await;
        verified = answer;
        status != 503
    })
    .await;
    if verified["matches"] != true {
        run.violation(format!("counter: verify answered {verified}"));
    }
    // 5. Every effect executed at least once; once after dedup by its id.
    {
        let got = received.lock().unwrap();
        let mut keys: HashMap<&str, HashSet<Option<&str>>> = HashMap::new();
        for (key, body) in &got.fx {
            let id = body["id"].as_str().unwrap_or_default();
            if !wanted_effects.contains(id) {
                run.violation(format!("effect {id:?} executed but never acknowledged"));
            }
            keys.entry(id).or_default().insert(key.as_deref());
        }
        for (id, k) in keys {
            if k.len() != 1 || k.contains(&None) {
                run.violation(format!("effect {id:?} carried idempotency keys {k:?}"));
            }
        }
        // 5b. Ordered groups: each writer's effects are one group.
        let first_runs: Vec<&str> = got
            .fx
            .iter()
            .map(|(_, body)| body["id"].as_str().unwrap_or_default())
            .collect();
        for v in check_groups(&first_runs) {
            run.violation(v);
        }
    }

    // 6. Reactor: the outbox holds exactly one welcome effect per sign-up
    //    in the log, at the sign-up's offset, and none without its event
    //    (the effects commit with the events, or neither does).
    let welcome_effects: HashMap<String, u64> =
        crate::effects::all_effects(s, "&component=reactor:welcome.v1")
            .await
            .iter()
            .map(|e| {
                (
                    e["key"].as_str().unwrap_or_default().to_string(),
                    e["checkpointOffset"].as_u64().unwrap_or_default(),
                )
            })
            .collect();
    if welcome_effects != signed_up {
        let missing: Vec<_> = signed_up
            .iter()
            .filter(|(k, o)| welcome_effects.get(*k) != Some(o))
            .collect();
        let without_event: Vec<_> = welcome_effects
            .iter()
            .filter(|(k, o)| signed_up.get(*k) != Some(o))
            .collect();
        run.violation(format!(
            "reactor: sign-ups without their effect {missing:?}; effects without their sign-up {without_event:?}"
        ));
    }
    for (key, body) in &received.lock().unwrap().welcome {
        let user = body["userId"].as_str().unwrap_or_default();
        if !signed_up.contains_key(&format!("welcome:{user}")) || key.is_none() {
            run.violation(format!(
                "welcome of {user:?} posted (key {key:?}) without its sign-up"
            ));
        }
    }

    let (hook_posts, fx_posts, welcome_posts) = {
        let got = received.lock().unwrap();
        (got.hook.len(), got.fx.len(), got.welcome.len())
    };
    let h = run.history.lock().unwrap();
    println!(
        "chaos: seed {seed}: {hosts} hosts, {crashes} crashes, {pauses} pauses, {cuts} cuts in {:.1} s; {} appends ({} events acknowledged, {} retried requests), \
         {} ingest events accepted ({} parked, {} gate effect posts), {} webhook posts ({} events skipped by policy), {} ITX event deliveries, {} effect posts, {} sign-ups ({} welcome effects, {} posts), \
         {} SSE connections ({} events), {} checkpoint reads, {} fresh reads; violations: {}",
        load_time.as_secs_f64(),
        h.appends,
        h.acked.len(),
        h.retries,
        h.ingested.len(),
        h.ingest_refused.len(),
        received.lock().unwrap().gate,
        hook_posts,
        skipped.len(),
        itx_offsets(&all_logs()).len(),
        fx_posts,
        signed_up.len(),
        welcome_effects.len(),
        welcome_posts,
        h.sse_connections,
        h.sse_events,
        h.checkpoints,
        h.fresh_reads,
        h.violations.len()
    );
    if !h.violations.is_empty() {
        // Keep the evidence: each host's data dir and every start's log.
        let keep = std::env::temp_dir().join(format!("streamhost-chaos-seed-{seed}"));
        let _ = std::fs::remove_dir_all(&keep);
        for (i, server) in servers.iter_mut().enumerate() {
            server.kill();
            let kept = if hosts > 1 {
                keep.join(format!("host-{i}"))
            } else {
                keep.clone()
            };
            std::fs::create_dir_all(kept.join("data")).unwrap();
            for dir in [server.dir.path().to_path_buf(), server.data_dir()] {
                for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                    if entry.path().is_file() {
                        let to = if dir == server.data_dir() {
                            kept.join("data")
                        } else {
                            kept.clone()
                        };
                        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
                    }
                }
            }
        }
        println!(
            "chaos: the data dir and server logs are kept in {}",
            keep.display()
        );
    }
    assert!(
        h.violations.is_empty(),
        "{} violations:\n{}",
        h.violations.len(),
        h.violations.join("\n")
    );
    assert!(
        h.acked.len() > 50,
        "the load did too little to mean anything"
    );
}

/// The checker finds what it is there to find.
/// The ordered groups' rule over the effect POSTs in arrival order (ids
/// `fx-{group}-{n}`, committed in the order of `n` within a group, as each
/// writer waits for its append before the next): each effect's first POST
/// comes after the first POST of every earlier one of its group. A kill
/// may run an effect again; it never lets a later one overtake it.
fn check_groups(posts: &[&str]) -> Vec<String> {
    let mut seen: HashSet<&str> = HashSet::new();
    let mut latest: HashMap<&str, u64> = HashMap::new();
    let mut violations = Vec::new();
    for id in posts {
        if !seen.insert(id) {
            continue;
        }
        let Some((group, n)) = id.strip_prefix("fx-").and_then(|r| r.rsplit_once('-')) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        let before = *latest.entry(group).or_insert(n);
        if before > n {
            violations.push(format!(
                "group {group:?}: effect {id:?} first ran after fx-{group}-{before}, \
                 which was committed after it"
            ));
        }
        latest.insert(group, before.max(n));
    }
    violations
}

#[test]
fn the_checker_sees_lost_duplicated_moved_and_unacknowledged_events() {
    let log = |events: &[(u64, &str)]| -> Vec<Value> {
        events
            .iter()
            .map(|(o, id)| json!({"offset": o, "payload": {"id": id}}))
            .collect()
    };
    let acked = vec![("a".to_string(), 1), ("b".to_string(), 2)];
    assert!(check_log("/s", &acked, &log(&[(1, "a"), (2, "b")])).is_empty());
    let lost = check_log("/s", &acked, &log(&[(1, "a")]));
    assert_eq!(lost, ["/s: b acknowledged at 2, found at None"]);
    let twice = check_log("/s", &acked, &log(&[(1, "a"), (2, "b"), (3, "b")]));
    assert_eq!(twice, ["/s: b acknowledged at 2, found at Some([2, 3])"]);
    let gap = check_log("/s", &acked, &log(&[(1, "a"), (3, "b")]));
    assert_eq!(gap.len(), 2, "{gap:?}");
    assert!(gap[0].contains("offset 3 at position 2"), "{gap:?}");
    let stranger = check_log("/s", &acked, &log(&[(1, "a"), (2, "b"), (3, "z")]));
    assert_eq!(stranger, ["/s: z at [3] was never acknowledged"]);

    assert_eq!(check_deliveries("hook", &[1, 2, 2, 3], &[1, 2, 3]), None);
    assert_eq!(check_deliveries("hook", &[1, 2, 1, 2, 3], &[1, 2, 3]), None);
    assert!(
        check_deliveries("hook", &[1, 3], &[1, 2, 3]).is_some(),
        "skipped"
    );
    assert!(
        check_deliveries("hook", &[2, 1, 3], &[1, 2, 3]).is_some(),
        "out of order"
    );
    assert!(
        check_deliveries("hook", &[1, 2, 3, 4], &[1, 2, 3]).is_some(),
        "a stranger"
    );

    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let accepted = ids(&["in-w0-1-0", "in-w1-1-0", "in-w0-2-0"]);
    assert!(check_ingest(&accepted, &ids(&["in-w1-1-0", "in-w0-1-0", "in-w0-2-0"])).is_empty());
    let lost = check_ingest(&accepted, &ids(&["in-w0-1-0", "in-w0-2-0"]));
    assert!(
        lost.iter()
            .any(|v| v.contains("in-w1-1-0 accepted, stored 0 times")),
        "{lost:?}"
    );
    let twice = check_ingest(
        &accepted,
        &ids(&["in-w0-1-0", "in-w1-1-0", "in-w0-2-0", "in-w0-2-0"]),
    );
    assert!(
        twice.iter().any(|v| v.contains("stored 2 times")),
        "{twice:?}"
    );
    let swapped = check_ingest(&accepted, &ids(&["in-w0-2-0", "in-w1-1-0", "in-w0-1-0"]));
    assert_eq!(
        swapped,
        ["ingest: producer w0 stored out of the accepted order"]
    );

    let posts = ["fx-w0-1", "fx-w1-1", "fx-w0-1", "fx-w0-2", "fx-w1-2"];
    assert!(check_groups(&posts).is_empty(), "a repeat is no overtaking");
    assert_eq!(
        check_groups(&["fx-w0-1", "fx-w0-3", "fx-w1-1", "fx-w0-2", "fx-w0-3"]),
        ["group \"w0\": effect \"fx-w0-2\" first ran after fx-w0-3, which was committed after it"]
    );
}
