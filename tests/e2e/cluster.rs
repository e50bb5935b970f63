//! Several hosts on one PostgreSQL database (runs when the suite runs on
//! PostgreSQL: `STREAMHOST_TEST_POSTGRES`). Each host is a real server
//! process with its own data dir; they share the test server's database.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::subscriptions::{ev, P};
use crate::support::{guest, wait_for, Server, SseClient};

/// Short leases, so a stopped host loses its streams quickly.
const CLUSTER: &str = "[cluster]\nlease-ms = 1500\n";

/// Whether this run has no PostgreSQL for several hosts, so the test is
/// skipped, with a line saying so (`support::skipped_on_sqlite`).
pub(crate) fn on_sqlite() -> bool {
    crate::support::skipped_on_sqlite("several hosts need PostgreSQL storage")
}

/// `GET /v1/cluster` through `through`: the answer, and the rows of the
/// hosts at `urls` (each must be listed).
pub(crate) async fn cluster_rows<const N: usize>(
    through: &Server,
    urls: [&str; N],
) -> (Value, [Value; N]) {
    let (status, cluster) = through.get("/v1/cluster").await;
    assert_eq!(status, 200, "{cluster}");
    let rows = urls.map(|url| {
        cluster["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["url"] == json!(url))
            .cloned()
            .unwrap_or_else(|| panic!("{url} is not listed: {cluster}"))
    });
    (cluster, rows)
}

fn offsets(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e["offset"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn any_host_serves_any_stream_through_its_owner() {
    if on_sqlite() {
        return;
    }
    let a = Server::start_with(Some(CLUSTER), &[]);
    let b = Server::joining(&a, Some(CLUSTER));
    let stream = format!("{P}/orders");
    // A creates the stream: A owns it.
    let (status, _) = a
        .post(&format!("{stream}:append"), ev("x.y/a", json!({"n": 1})))
        .await;
    assert_eq!(status, 200);
    // A live connection through B is fed by the owner.
    let mut live = SseClient::open(&b, &format!("{stream}:connect?replayAfterOffset=0"))
        .await
        .expect("a connection through B");
    // Appends through B go to A; offsets stay dense.
    for n in 2..=4 {
        let (status, out) = b
            .post(&format!("{stream}:append"), ev("x.y/a", json!({"n": n})))
            .await;
        assert_eq!(status, 200, "{out}");
    }
    let through_a = a.all_events(&stream).await;
    let through_b = b.all_events(&stream).await;
    assert_eq!(through_a, through_b);
    let all = offsets(&through_a);
    assert_eq!(all, (1..=all.len() as u64).collect::<Vec<_>>(), "dense");
    let ns: Vec<_> = through_a
        .iter()
        .filter(|e| e["type"] == "x.y/a")
        .map(|e| e["payload"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, vec![1, 2, 3, 4]);
    let mut seen = Vec::new();
    while seen.len() < all.len() {
        let batch = live.batch().await;
        seen.extend(offsets(batch["events"].as_array().unwrap()));
    }
    assert_eq!(seen, all, "the connection through B");
    // Both hosts are in the cluster; A holds the stream.
    let (cluster, [a_row, b_row]) = cluster_rows(&b, [&a.url, &b.url]).await;
    assert_eq!(cluster["self"], json!(b.url));
    assert_eq!(a_row["streams"], 1, "{cluster}");
    assert_eq!(b_row["streams"], 0, "{cluster}");
}

#[tokio::test]
async fn a_deposed_owner_cannot_commit() {
    if on_sqlite() {
        return;
    }
    let a = Server::start_with(Some(CLUSTER), &[]);
    let b = Server::joining(&a, Some(CLUSTER));
    let stream = format!("{P}/ledger");
    let (status, _) = a
        .post(&format!("{stream}:append"), ev("x.y/a", json!({"by": "a"})))
        .await;
    assert_eq!(status, 200);
    // A stops (as in a long pause): it renews nothing, its lease expires,
    // and B takes the stream over and writes to it.
    a.signal("STOP");
    // Until A's lease expires, B forwards to A, which does not answer
    // (503 after a lease's length); then B owns the stream. The same key
    // makes the retries one event.
    let by_b =
        json!({"events": [{"type": "x.y/a", "payload": {"by": "b"}, "idempotencyKey": "b-1"}]});
    wait_for(
        "B to take the stream over",
        Duration::from_secs(20),
        async || b.post(&format!("{stream}:append"), by_b.clone()).await.0 == 200,
    )
    .await;
    a.signal("CONT");
    // A's actor still holds the old lease. Its write is either refused in
    // the commit (the lease's epoch moved) or, once A's renewal found its
    // leases had lapsed and A loaded the stream again, sent to B, the
    // owner: never committed by A under the old epoch.
    let (status, out) = a
        .post(
            &format!("{stream}:append"),
            json!({"events": [{"type": "x.y/a", "payload": {"by": "a-after"}, "idempotencyKey": "a-after"}]}),
        )
        .await;
    let events = b.all_events(&stream).await;
    let stored = events
        .iter()
        .filter(|e| e["payload"]["by"] == "a-after")
        .count();
    if status == 200 {
        assert_eq!(stored, 1, "acknowledged through B once: {events:?}");
        assert_eq!(out["events"][0]["offset"], events.last().unwrap()["offset"]);
    } else {
        assert_eq!(stored, 0, "a deposed owner committed: {out} {events:?}");
        let log = a.log();
        assert!(
            log.contains("a deposed owner's write is refused")
                || out["error"]["code"] == "lease-lost",
            "A says why ({out}):\n{log}"
        );
    }
    assert_eq!(
        offsets(&events),
        (1..=events.len() as u64).collect::<Vec<_>>()
    );
    // Retried as `lease-lost` asks, A learns the owner and the request
    // goes to B (a busy host may answer `lease-lost` once more first).
    let mut answer = (0, Value::Null);
    let reached = crate::support::poll_until(Duration::from_secs(10), async || {
        answer = a
            .post(
                &format!("{stream}:append"),
                json!({"events": [{"type": "x.y/a", "payload": {"by": "a-retry"}, "idempotencyKey": "a-retry"}]}),
            )
            .await;
        if answer.0 != 200 {
            assert_eq!(
                (answer.0, &answer.1["error"]["code"]),
                (503, &json!("lease-lost")),
                "{}",
                answer.1
            );
        }
        answer.0 == 200
    })
    .await;
    assert!(reached, "A never sent the append to B: {}", answer.1);
    let events = b.all_events(&stream).await;
    assert_eq!(events.last().unwrap()["payload"]["by"], "a-retry");
}

/// Waits for a live connection on a host that lost its lease to end
/// (closed with `lease-lost`, or cut), seeing on the way only events from
/// before `acked_offset` (what that host had committed).
async fn ends_for_the_lost_lease(live: &mut SseClient, acked_offset: u64) {
    let waiting = Instant::now();
    loop {
        let next = live.next_within(Duration::from_secs(10)).await;
        assert!(
            next.is_some() || waiting.elapsed() < Duration::from_secs(10),
            "the live connection is still open"
        );
        match next {
            Some((event, data)) if event == "closed" => {
                assert_eq!(data["reason"], "lease-lost", "{data}");
                return;
            }
            Some((event, data)) if event == "batch" => {
                let got = offsets(data["events"].as_array().unwrap());
                assert!(got.iter().all(|o| *o < acked_offset), "{data}");
            }
            Some(other) => panic!("unexpected {other:?}"),
            None => return,
        }
    }
}

/// A paused owner (SIGSTOP past its lease) whose stream another host took
/// over and appended to serves no read without that append once it runs
/// again: it answers `503 lease-lost` (with `retry-after`) until its
/// renewal finds the lease moved, then sends reads to the new owner. Its
/// open live connection ends.
#[tokio::test]
async fn a_paused_owner_never_serves_a_stale_read() {
    if on_sqlite() {
        return;
    }
    let a = Server::start_with(Some(CLUSTER), &[]);
    let b = Server::joining(&a, Some(CLUSTER));
    let stream = format!("{P}/stale");
    let (status, _) = a
        .post(&format!("{stream}:append"), ev("x.y/a", json!({"by": "a"})))
        .await;
    assert_eq!(status, 200);
    let mut live = SseClient::open(&a, &format!("{stream}:connect?replayAfterOffset=0"))
        .await
        .expect("a connection on the owner");
    let first = live.batch().await;
    assert!(!offsets(first["events"].as_array().unwrap()).is_empty());
    a.signal("STOP");
    let by_b =
        json!({"events": [{"type": "x.y/a", "payload": {"by": "b"}, "idempotencyKey": "b-1"}]});
    let mut acked = Value::Null;
    wait_for(
        "B to take the stream over and acknowledge an append",
        Duration::from_secs(20),
        async || {
            let (status, out) = b.post(&format!("{stream}:append"), by_b.clone()).await;
            acked = out;
            status == 200
        },
    )
    .await;
    let acked_offset = acked["events"][0]["offset"].as_u64().unwrap();
    a.signal("CONT");
    // Every read that begins now, through A, sees the acknowledged event
    // or is refused; none is served from A's memory of the stream.
    let client = reqwest::Client::new();
    let (mut refused, mut served) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline || served == 0 {
        assert!(
            Instant::now() < deadline + Duration::from_secs(20),
            "A never served the stream again ({refused} refused)"
        );
        let answer = client
            .get(format!("{}{stream}:events?afterOffset=0&limit=500", a.url))
            .send()
            .await
            .expect("A answers");
        let status = answer.status().as_u16();
        let retry_after = answer.headers().get("retry-after").cloned();
        let body: Value = answer.json().await.expect("JSON");
        match status {
            200 => {
                let offsets = offsets(body["events"].as_array().unwrap());
                assert!(
                    offsets.contains(&acked_offset),
                    "a stale read through A after the append at {acked_offset} was acknowledged: {body}"
                );
                served += 1;
            }
            503 => {
                assert!(retry_after.is_some(), "a 503 without retry-after: {body}");
                let code = body["error"]["code"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                assert!(
                    code == "lease-lost" || code == "stream-owned-elsewhere",
                    "{body}"
                );
                refused += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
        let (status, state) = a.get(&format!("{stream}:state")).await;
        if status == 200 {
            assert!(
                state["maxOffset"].as_u64().unwrap() >= acked_offset,
                "a stale state through A: {state}"
            );
        } else {
            assert_eq!(status, 503, "{state}");
        }
    }
    assert!(served > 0);
    // The live connection on A ended: closed for the lost lease, or cut.
    ends_for_the_lost_lease(&mut live, acked_offset).await;
    assert!(
        a.log().contains("could not renew its leases in time")
            || a.log().contains("leases had expired in the database"),
        "A's log says it lost its leases:\n{}",
        a.log()
    );
}

/// What the webhook receiver got: (source path, source offset, when).
type Posts = Arc<Mutex<Vec<(String, u64, Instant)>>>;

async fn webhook_receiver() -> (String, Posts) {
    let posts: Posts = Arc::default();
    async fn hook(State(posts): State<Posts>, Json(body): Json<Value>) -> StatusCode {
        let path = body["path"].as_str().unwrap_or_default().to_string();
        let offset = body["event"]["offset"].as_u64().unwrap_or_default();
        posts.lock().unwrap().push((path, offset, Instant::now()));
        StatusCode::OK
    }
    let app = Router::new()
        .route("/hook", post(hook))
        .with_state(posts.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, posts)
}

const FAILOVER: &str = "[cluster]\nlease-ms = 1000\n\n[delivery]\nmax-attempts = 50\nbackoff-base-ms = 20\nbackoff-max-ms = 200\ntimeout-ms = 3000\n";

/// Appends one keyed event through `hosts` (the first that answers), again
/// with the same key until one answers 200; answers the committed offset.
async fn append_somewhere(hosts: &[&Server], path: &str, key: &str, round: usize) -> u64 {
    let body =
        json!({"events": [{"type": "x.y/a", "payload": {"key": key}, "idempotencyKey": key}]});
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut i = round;
    loop {
        let host = hosts[i % hosts.len()];
        i += 1;
        let (status, out) = host.post(&format!("{P}{path}:append"), body.clone()).await;
        if status == 200 {
            return out["events"][0]["offset"].as_u64().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "{path} {key}: still {status} {out}"
        );
        // Pacing between retries of an unknown outcome, not a wait for a condition.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_hosts_streams_resume_on_the_others_with_nothing_lost() {
    if on_sqlite() {
        return;
    }
    let (receiver, posts) = webhook_receiver().await;
    let mut a = Server::start_with(Some(FAILOVER), &[]);
    let b = Server::joining(&a, Some(FAILOVER));
    let c = Server::joining(&a, Some(FAILOVER));
    // Six source streams, two created (owned) through each host; each is
    // copied into a receiving stream created through the next host, so
    // copies cross hosts, and posted to a webhook.
    let hosts = [&a, &b, &c];
    let sources: Vec<String> = (0..6).map(|i| format!("/src{i}")).collect();
    for (i, src) in sources.iter().enumerate() {
        let owner = hosts[i % 3];
        let next = hosts[(i + 1) % 3];
        let (status, out) = next
            .post(&format!("{P}/dst{i}:append"), ev("x.y/start", json!({})))
            .await;
        assert_eq!(status, 200, "{out}");
        let hook = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
            "payload": {"subscriptionKey": "hook", "receiver": {"action": "webhook-post",
                "url": format!("{receiver}/hook"), "delivery": {"start": "beginning", "onFailingEvent": "halt"}},
                "filter": {"eventTypes": ["x.y/a"]}}}]});
        let (status, out) = owner.post(&format!("{P}{src}:append"), hook).await;
        assert_eq!(status, 200, "{out}");
        let (status, out) = next
            .post(
                &format!("{P}/dst{i}:subscribeToEventsFrom"),
                json!({"sourceStreamPath": src, "subscriptionKey": "copy", "start": "beginning",
                       "filter": {"eventTypes": ["x.y/a"]}}),
            )
            .await;
        assert_eq!(status, 200, "{out}");
    }
    // The counter processor is woken by A's streams /src0 and /src3.
    let (status, out) = a.deploy("acme", "counter", guest("counter")).await;
    assert_eq!(status, 200, "{out}");
    for src in ["/src0", "/src3"] {
        let wake = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
            "payload": {"subscriptionKey": "count", "receiver": {"action": "processor-wake",
                "expression": ["components", ["get", "counter"], "wake"]}}}]});
        let (status, out) = a.post(&format!("{P}{src}:append"), wake).await;
        assert_eq!(status, 200, "{out}");
    }
    // Load through every host, then A is killed and the load goes on
    // through B and C.
    let mut acked: Vec<(String, String, u64)> = Vec::new();
    for round in 0..60 {
        let src = &sources[round % 6];
        let key = format!("k{round}");
        let offset = append_somewhere(&hosts, src, &key, round).await;
        acked.push((src.clone(), key, offset));
    }
    a.kill();
    let killed = Instant::now();
    // The first event appended to /src0 after the kill: when does the
    // counter's checkpoint reach it (polled through B)?
    let target: Arc<Mutex<Option<u64>>> = Arc::default();
    let woken = {
        let (target, url) = (
            target.clone(),
            format!("{}{P}/src0:processors/counter", b.url),
        );
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            loop {
                let want = *target.lock().unwrap();
                if let Some(want) = want {
                    if let Ok(r) = client.get(&url).send().await {
                        let p: Value = r.json().await.unwrap_or_default();
                        if p["checkpointOffset"].as_u64().is_some_and(|at| at >= want) {
                            return Instant::now();
                        }
                    }
                }
                // The poll's period, not a wait for a condition.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let survivors = [&b, &c];
    for round in 60..120 {
        let src = &sources[round % 6];
        let key = format!("k{round}");
        let offset = append_somewhere(&survivors, src, &key, round).await;
        if round == 60 {
            *target.lock().unwrap() = Some(offset);
        }
        acked.push((src.clone(), key, offset));
    }
    let woke = tokio::time::timeout(Duration::from_secs(30), woken)
        .await
        .expect("the counter's checkpoint reaches the first event after the kill")
        .unwrap();
    let took = woke.duration_since(killed);
    println!(
        "A's processor woken again {} ms after the kill",
        took.as_millis()
    );
    // A generous bound (five 1 s leases): what it guards is that the
    // survivors take A's wakes over when its lease lapses, not at some
    // later event (a restart, a deploy). The figure itself is printed
    // above.
    assert!(
        took < Duration::from_secs(5),
        "wakes resumed after {took:?}"
    );
    // Every acknowledged event is in its source once, at its offset.
    for src in &sources {
        let events = b.all_events(&format!("{P}{src}")).await;
        let all = offsets(&events);
        assert_eq!(
            all,
            (1..=all.len() as u64).collect::<Vec<_>>(),
            "{src} dense"
        );
        for (s, key, offset) in acked.iter().filter(|(s, _, _)| s == src) {
            let holding: Vec<u64> = events
                .iter()
                .filter(|e| e["payload"]["key"] == json!(key))
                .map(|e| e["offset"].as_u64().unwrap())
                .collect();
            assert_eq!(holding, vec![*offset], "{s} {key}");
        }
    }
    // A's streams (src0, src3) deliver again within 5 s of the kill: their
    // events appended after it reach the webhook, and every event does.
    let after_kill: Vec<(String, u64)> = acked[60..]
        .iter()
        .filter(|(s, _, _)| s == "/src0" || s == "/src3")
        .map(|(s, _, o)| (s.clone(), *o))
        .collect();
    wait_for(
        "every event at the webhook",
        Duration::from_secs(30),
        async || {
            let got = posts.lock().unwrap();
            acked
                .iter()
                .all(|(s, _, o)| got.iter().any(|(p, off, _)| p == s && off == o))
        },
    )
    .await;
    let resumed = {
        let got = posts.lock().unwrap();
        after_kill
            .iter()
            .filter_map(|(s, o)| {
                got.iter()
                    .find(|(p, off, _)| p == s && off == o)
                    .map(|(_, _, t)| *t)
            })
            .min()
            .expect("a delivery of A's streams after the kill")
    };
    let took = resumed.duration_since(killed);
    println!(
        "A's streams delivered again {} ms after the kill",
        took.as_millis()
    );
    // A generous bound, as for the wakes above: deliveries resume when
    // the lease lapses.
    assert!(
        took < Duration::from_secs(5),
        "deliveries resumed after {took:?}"
    );
    // Copies, across hosts: each source event exactly once in its receiver.
    for (i, src) in sources.iter().enumerate() {
        wait_for(
            "the copies to catch up",
            Duration::from_secs(30),
            async || {
                let copies = b.all_events(&format!("{P}/dst{i}")).await;
                let keys = copies.iter().filter(|e| e["type"] == "x.y/a").count();
                keys == acked.iter().filter(|(s, _, _)| s == src).count()
            },
        )
        .await;
        let copies = b.all_events(&format!("{P}/dst{i}")).await;
        let mut keys: Vec<String> = copies
            .iter()
            .filter(|e| e["type"] == "x.y/a")
            .map(|e| e["payload"]["key"].as_str().unwrap().to_string())
            .collect();
        let mut expected: Vec<String> = acked
            .iter()
            .filter(|(s, _, _)| s == src)
            .map(|(_, k, _)| k.clone())
            .collect();
        assert_eq!(keys, expected, "/dst{i}: in source order");
        keys.dedup();
        expected.dedup();
        assert_eq!(keys.len(), expected.len(), "/dst{i}: once each");
    }
}

#[tokio::test]
async fn a_lease_lasts_as_long_as_its_owner_says() {
    if on_sqlite() {
        return;
    }
    // A renews every 20 s (60 s leases); B, configured with 300 ms leases,
    // must still not take A's streams between A's renewals.
    let a = Server::start_with(Some("[cluster]\nlease-ms = 60000\n"), &[]);
    let b = Server::joining(&a, Some("[cluster]\nlease-ms = 300\n"));
    let stream = format!("{P}/held");
    let (status, out) = a
        .post(&format!("{stream}:append"), ev("x.y/a", json!({"n": 0})))
        .await;
    assert_eq!(status, 200, "{out}");
    // Writes through B, one after another, for over a second: many of B's
    // lease lengths after A's last renewal, well within A's own.
    let started = Instant::now();
    let mut n = 1;
    while started.elapsed() < Duration::from_millis(1500) {
        let (status, out) = b
            .post(&format!("{stream}:append"), ev("x.y/a", json!({"n": n})))
            .await;
        assert_eq!(status, 200, "{out}");
        n += 1;
    }
    let (cluster, [a_row, b_row]) = cluster_rows(&b, [&a.url, &b.url]).await;
    assert_eq!(a_row["live"], true, "{cluster}");
    assert_eq!(a_row["streams"], 1, "A still holds the stream: {cluster}");
    assert_eq!(b_row["streams"], 0, "{cluster}");
    assert!(
        !b.log().contains("taking over a stream"),
        "B took A's stream:\n{}",
        b.log()
    );
}

/// A webhook receiver that refuses (503) until `accept` is set.
async fn gated_webhook_receiver() -> (String, Posts, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    type Gate = (Posts, Arc<AtomicBool>);
    async fn hook(State((posts, accept)): State<Gate>, Json(body): Json<Value>) -> StatusCode {
        if !accept.load(Ordering::SeqCst) {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        let path = body["path"].as_str().unwrap_or_default().to_string();
        let offset = body["event"]["offset"].as_u64().unwrap_or_default();
        posts.lock().unwrap().push((path, offset, Instant::now()));
        StatusCode::OK
    }
    let (posts, accept): Gate = (Arc::default(), Arc::default());
    let app = Router::new()
        .route("/hook", post(hook))
        .with_state((posts.clone(), accept.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, posts, accept)
}

/// Leases far longer than the test's bound: a stream can only move in
/// time if the stopping host hands it over.
const LONG_LEASES: &str = "[cluster]\nlease-ms = 60000\n\n[delivery]\nmax-attempts = 1000\nbackoff-base-ms = 20\nbackoff-max-ms = 100\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_host_hands_its_streams_over_at_once() {
    if on_sqlite() {
        return;
    }
    let (receiver, posts, accept) = gated_webhook_receiver().await;
    let mut a = Server::start_with(Some(LONG_LEASES), &[]);
    let b = Server::joining(&a, Some(LONG_LEASES));
    // A owns two streams: one with a webhook whose receiver refuses for
    // now (its delivery is retried on A), one that is only written to.
    let (quiet, busy) = (format!("{P}/quiet"), format!("{P}/busy"));
    let hook = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "hook", "receiver": {"action": "webhook-post",
            "url": format!("{receiver}/hook"), "delivery": {"start": "beginning", "onFailingEvent": "halt"}},
            "filter": {"eventTypes": ["x.y/a"]}}}]});
    let (status, out) = a.post(&format!("{quiet}:append"), hook).await;
    assert_eq!(status, 200, "{out}");
    let (status, out) = a
        .post(&format!("{quiet}:append"), ev("x.y/a", json!({"n": 1})))
        .await;
    assert_eq!(status, 200, "{out}");
    let pending = out["events"][0]["offset"].as_u64().unwrap();
    let (status, out) = a
        .post(&format!("{busy}:append"), ev("x.y/a", json!({"n": 1})))
        .await;
    assert_eq!(status, 200, "{out}");
    // A stops (SIGTERM) with the webhook's delivery outstanding; then the
    // receiver accepts.
    a.stop();
    let stopped = Instant::now();
    accept.store(true, std::sync::atomic::Ordering::SeqCst);
    // B takes the written stream at once (not after A's 60 s lease)...
    let body =
        json!({"events": [{"type": "x.y/a", "payload": {"n": 2}, "idempotencyKey": "after-stop"}]});
    wait_for(
        "B to append to A's stream",
        Duration::from_secs(5),
        async || b.post(&format!("{busy}:append"), body.clone()).await.0 == 200,
    )
    .await;
    // ...and, told by the stopping host (LISTEN/NOTIFY), the stream nobody
    // touches: its outstanding delivery resumes on B.
    wait_for(
        "the outstanding delivery from B",
        Duration::from_secs(5),
        async || {
            posts
                .lock()
                .unwrap()
                .iter()
                .any(|(p, o, _)| p == "/quiet" && *o == pending)
        },
    )
    .await;
    println!(
        "A's streams moved to B {} ms after A stopped",
        stopped.elapsed().as_millis()
    );
    assert!(
        b.log().contains("a host stopped: taking over its streams"),
        "B heard A stop:\n{}",
        b.log()
    );
    assert!(
        a.log().contains("gave this host's streams up"),
        "A's log:\n{}",
        a.log()
    );
    let (cluster, [a_row, b_row]) = cluster_rows(&b, [&a.url, &b.url]).await;
    assert_eq!(a_row["live"], false, "{cluster}");
    assert_eq!(a_row["streams"], 0, "{cluster}");
    assert_eq!(b_row["streams"], 2, "{cluster}");
    // A restarted takes nothing back by itself, and is served through B.
    a.launch();
    let events = a.all_events(&busy).await;
    assert_eq!(offsets(&events), vec![1, 2, 3], "{events:?}");
}

/// Deploys the counter as `proc` through `host` and subscribes it to
/// `stream` (processor wakes); answers the deploy.
async fn counter_woken_by(host: &Server, stream: &str) -> Value {
    let (status, v1) = host.deploy("acme", "proc", guest("counter")).await;
    assert_eq!(status, 200, "{v1}");
    let wake = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "p", "receiver": {"action": "processor-wake",
            "expression": ["components", ["get", "proc"], "wake"]}}}]});
    let (status, out) = host.post(&format!("{stream}:append"), wake).await;
    assert_eq!(status, 200, "{out}");
    v1
}

/// Two hosts; A owns `/orders`, whose processor runs the counter (the
/// version answered) and has folded one event.
async fn two_hosts_with_a_counter_on_a() -> (Server, Server, String, Value) {
    let a = Server::start_with(Some(CLUSTER), &[]);
    let b = Server::joining(&a, Some(CLUSTER));
    let stream = format!("{P}/orders");
    let v1 = counter_woken_by(&a, &stream).await;
    a.post(&format!("{stream}:append"), ev("x.y/a", json!({})))
        .await;
    let p = crate::processors::caught_up(&a, &stream, "proc").await;
    assert_eq!(p["digest"], v1["digest"], "{p}");
    (a, b, stream, v1)
}

#[tokio::test]
async fn a_version_deployed_through_another_host_is_the_one_the_owner_runs() {
    if on_sqlite() {
        return;
    }
    let (a, b, stream, v1) = two_hosts_with_a_counter_on_a().await;
    // A new version through B; A owns the stream and runs the processor.
    let (status, v2) = b.deploy("acme", "proc", guest("effector")).await;
    assert_eq!(status, 200, "{v2}");
    assert_ne!(v1["digest"], v2["digest"]);
    a.post(&format!("{stream}:append"), ev("x.y/a", json!({})))
        .await;
    wait_for(
        "A to run the new version",
        Duration::from_secs(30),
        async || {
            let (_, p) = a.get(&format!("{stream}:processors/proc")).await;
            p["digest"] == v2["digest"]
        },
    )
    .await;
}

/// A shadow deployed through a host that does not own the stream: the
/// owner folds it when asked (requests are forwarded there), and its
/// promotion through the other host switches the owner's instance.
#[tokio::test]
async fn a_shadow_deployed_through_another_host_is_folded_and_promoted_by_the_owner() {
    if on_sqlite() {
        return;
    }
    let (a, b, stream, v1) = two_hosts_with_a_counter_on_a().await;
    let (status, v2) = b
        .deploy_with_query("acme", "proc", guest("effector"), "refold=shadow")
        .await;
    assert_eq!(status, 200, "{v2}");
    assert_eq!(v2["shadowing"], json!(["/orders"]), "{v2}");
    let mut seen = Value::Null;
    wait_for(
        "the shadow to be ready, asked through B",
        Duration::from_secs(30),
        async || {
            let (status, v) = b.get(&format!("{stream}:processors/proc/shadow")).await;
            assert_eq!(status, 200, "{v}");
            seen = v;
            seen["status"] == "ready"
        },
    )
    .await;
    assert_eq!(seen["liveDigest"], v1["digest"], "{seen}");
    assert!(!seen["stateDiff"].as_array().unwrap().is_empty(), "{seen}");
    let (_, live) = a.get(&format!("{stream}:processors/proc")).await;
    assert_eq!(live["digest"], v1["digest"], "the live version serves");
    let (status, promoted) = b
        .post(
            &format!("{stream}:promoteShadow"),
            json!({"component": "proc"}),
        )
        .await;
    assert_eq!(status, 200, "{promoted}");
    let (_, after) = a.get(&format!("{stream}:processors/proc")).await;
    assert_eq!(after["digest"], v2["digest"], "{after}");
}

/// Holds a lock in the server's database from a connection of the test's
/// own (its own thread): `sql` runs inside a transaction that stays open
/// until the returned sender is dropped or sent to.
fn hold_lock(server: &Server, sql: &str) -> std::sync::mpsc::Sender<()> {
    let crate::support::TestDb::Postgres(url) = server.db() else {
        panic!("a host on PostgreSQL");
    };
    let sql = sql.to_string();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connecting");
        let mut t = c.transaction().expect("BEGIN");
        t.batch_execute(&sql).expect("taking the lock");
        locked_tx.send(()).unwrap();
        let _ = release_rx.recv();
        t.rollback().expect("ROLLBACK");
    });
    locked_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the lock taken");
    release_tx
}

/// A database call that would wait on a lock fails after `[cluster]
/// db-timeout-ms` instead of hanging: the append answers an error while the
/// lock is still held, and works once it is gone.
#[tokio::test]
async fn a_database_call_that_hangs_fails_after_db_timeout_ms() {
    if on_sqlite() {
        return;
    }
    let a = Server::start_with(
        Some("[cluster]\nlease-ms = 1500\ndb-timeout-ms = 500\n"),
        &[],
    );
    let stream = format!("{P}/locked");
    let (status, _) = a
        .post(&format!("{stream}:append"), ev("x.y/a", json!({"n": 1})))
        .await;
    assert_eq!(status, 200);
    // Every commit of the stream checks its lease row FOR SHARE: a lock
    // held elsewhere makes it wait.
    let release = hold_lock(
        &a,
        "SELECT 1 FROM stream_leases WHERE path = '/locked' FOR UPDATE",
    );
    let started = Instant::now();
    let (status, out) = a
        .post(&format!("{stream}:append"), ev("x.y/a", json!({"n": 2})))
        .await;
    let waited = started.elapsed();
    assert_ne!(status, 200, "committed past a held lock: {out}");
    assert!(
        waited < Duration::from_secs(10),
        "the append hung {waited:?} on a held lock"
    );
    assert!(
        a.log().contains("lock timeout") || a.log().contains("canceling statement"),
        "the log names the timeout:\n{}",
        a.log()
    );
    drop(release);
    wait_for(
        "appends to work again",
        Duration::from_secs(20),
        async || {
            a.post(&format!("{stream}:append"), ev("x.y/a", json!({"n": 3})))
                .await
                .0
                == 200
        },
    )
    .await;
    let ns: Vec<u64> = a
        .all_events(&stream)
        .await
        .iter()
        .filter(|e| e["type"] == "x.y/a")
        .map(|e| e["payload"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns.first(), Some(&1));
    assert!(!ns.contains(&2), "the refused append was stored: {ns:?}");
}

/// The port of the test PostgreSQL (from `STREAMHOST_TEST_POSTGRES`).
pub(crate) fn postgres_port() -> u16 {
    let base = crate::support::postgres_base().expect("PostgreSQL");
    let host_port = base.rsplit('@').next().unwrap();
    let host_port = host_port.split('/').next().unwrap();
    host_port
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(5432)
}

/// A host cut off from PostgreSQL (a proxy that stops every byte, the
/// connections left open) stops serving its streams before another host
/// takes them over: its reads answer `503 lease-lost`, its live connection
/// ends; the other host takes the stream within `lease-ms + db-timeout-ms`
/// (the cut host's open transaction is ended by the server) and
/// acknowledges an append; no read through the cut host ever misses it;
/// healed, the cut host sends reads to the new owner.
#[tokio::test]
async fn a_host_cut_off_from_postgres_stops_serving_before_another_takes_over() {
    if on_sqlite() {
        return;
    }
    const CONFIG: &str = "[cluster]\nlease-ms = 1500\ndb-timeout-ms = 1000\n";
    let proxy = crate::support::TcpCut::start(postgres_port());
    let b = Server::start_with(Some(CONFIG), &[]);
    let a = Server::joining_through(&b, Some(CONFIG), &proxy);
    let stream = format!("{P}/partitioned");
    // A creates the stream and owns it; appends keep it busy through the cut.
    let (status, out) = a
        .post(&format!("{stream}:append"), ev("x.y/a", json!({"by": "a"})))
        .await;
    assert_eq!(status, 200, "{out}");
    let mut live = SseClient::open(&a, &format!("{stream}:connect?replayAfterOffset=0"))
        .await
        .expect("a connection on the owner");
    live.batch().await;
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (url, stream, written) = (a.url.clone(), stream.clone(), written.clone());
        tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap();
            for n in 0..200u64 {
                let body = json!({"events": [{"type": "x.y/w", "payload": {"n": n}}]});
                let _ = client
                    .post(format!("{url}{stream}:append"))
                    .json(&body)
                    .send()
                    .await;
                written.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    // The cut comes while appends flow.
    wait_for(
        "appends flowing through A",
        Duration::from_secs(10),
        async || written.load(std::sync::atomic::Ordering::SeqCst) >= 5,
    )
    .await;
    let cut_at = Instant::now();
    proxy.cut();
    // B takes the stream over and acknowledges an append.
    let by_b =
        json!({"events": [{"type": "x.y/a", "payload": {"by": "b"}, "idempotencyKey": "b-1"}]});
    let mut acked = Value::Null;
    wait_for(
        "B to take the stream over",
        Duration::from_secs(30),
        async || {
            let (status, out) = b.post(&format!("{stream}:append"), by_b.clone()).await;
            acked = out;
            status == 200
        },
    )
    .await;
    let took = cut_at.elapsed();
    let acked_offset = acked["events"][0]["offset"].as_u64().unwrap();
    assert!(
        took < Duration::from_millis(1500 + 1000) + Duration::from_secs(5),
        "the takeover took {took:?}"
    );
    // Through A (still cut off): never a read without B's append.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let read = async |client: &reqwest::Client| -> (u16, Value) {
        match client
            .get(format!("{}{stream}:events?afterOffset=0&limit=500", a.url))
            .send()
            .await
        {
            Ok(r) => {
                let status = r.status().as_u16();
                (status, r.json().await.unwrap_or(Value::Null))
            }
            Err(_) => (0, Value::Null), // no answer in time: not a stale read
        }
    };
    let check = |status: u16, body: &Value| {
        if status == 200 {
            let got = offsets(body["events"].as_array().unwrap());
            assert!(
                got.contains(&acked_offset),
                "a stale read through A after B acknowledged offset {acked_offset}: {body}"
            );
        }
        status
    };
    let mut refused = 0;
    for _ in 0..10 {
        let (status, body) = read(&client).await;
        assert_ne!(check(status, &body), 200, "A served while cut off: {body}");
        if status != 0 {
            assert_eq!(body["error"]["code"], "lease-lost", "{body}");
            refused += 1;
        }
    }
    assert_eq!(
        refused, 10,
        "A answered every read at once (503), none hung"
    );
    // A's live connection ended.
    ends_for_the_lost_lease(&mut live, acked_offset).await;
    // Healed: A learns its lease moved and sends reads to B.
    proxy.heal();
    let mut served = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !served {
        assert!(Instant::now() < deadline, "A never served the stream again");
        let (status, body) = read(&client).await;
        served = check(status, &body) == 200;
    }
    writer.abort();
    // Offsets stayed dense whoever wrote them.
    let events = b.all_events(&stream).await;
    assert_eq!(
        offsets(&events),
        (1..=events.len() as u64).collect::<Vec<_>>()
    );
}

/// `sslmode=require` in the PostgreSQL URL is honoured: with the test
/// server's CA (`sslrootcert`) every connection of the host is encrypted
/// (PostgreSQL's `pg_stat_ssl` says so); without a CA that vouches for the
/// server, the host refuses to start, naming the certificate.
#[tokio::test]
async fn sslmode_require_connects_with_tls_and_verifies_the_server() {
    if on_sqlite() {
        return;
    }
    let ca = std::env::var("STREAMHOST_TEST_POSTGRES_CA").unwrap_or_default();
    if ca.is_empty() || !std::path::Path::new(&ca).exists() {
        assert!(
            std::env::var("CI").is_err(),
            "CI runs the PostgreSQL pass with TLS: STREAMHOST_TEST_POSTGRES_CA ({ca:?}) names no file"
        );
        println!("skipped: the test PostgreSQL has no TLS (STREAMHOST_TEST_POSTGRES_CA)");
        return;
    }
    let a = Server::start_with(Some(CLUSTER), &[]);
    let url = a.postgres_url().expect("PostgreSQL").to_string();
    let db = url.rsplit('/').next().unwrap().to_string();
    let b = Server::joining_at(
        Some(CLUSTER),
        format!("{url}?sslmode=require&sslrootcert={ca}"),
    )
    .unwrap_or_else(|log| panic!("the host with sslmode=require did not start:\n{log}"));
    let stream = format!("{P}/tls");
    let (status, out) = b
        .post(&format!("{stream}:append"), ev("x.y/a", json!({"n": 1})))
        .await;
    assert_eq!(status, 200, "{out}");
    // Every connection from B is TLS; A (no sslmode) stays in plain text.
    let count = |ssl: bool| {
        a.db().query_i64(&format!(
            "SELECT COUNT(*) FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid
             WHERE a.datname = '{db}' AND s.ssl = {ssl}"
        ))
    };
    assert!(count(true).unwrap() >= 2, "B's connections are not TLS");
    // Without the CA, the server's certificate is not trusted.
    let refused = Server::joining_at(Some(CLUSTER), format!("{url}?sslmode=require"))
        .err()
        .expect("a host that cannot verify the server must not start");
    assert!(
        refused.contains("certificate") || refused.contains("UnknownIssuer"),
        "the refusal names the certificate:\n{refused}"
    );
}

/// A host that does not own a stream keeps no actor of it and does not
/// lock its lease row per request: it remembers the owner for a lease, so
/// requests through it go on while the lease row is locked elsewhere (as
/// the owner's commits lock it), and its actors go once they answered.
#[tokio::test]
async fn a_non_owner_remembers_the_owner_and_keeps_no_actor() {
    if on_sqlite() {
        return;
    }
    const CONFIG: &str = "[cluster]\nlease-ms = 5000\ndb-timeout-ms = 500\n";
    let a = Server::start_with(Some(CONFIG), &[]);
    let b = Server::joining(&a, Some(CONFIG));
    let stream = format!("{P}/remembered");
    let (status, _) = a
        .post(&format!("{stream}:append"), ev("x.y/a", json!({"n": 1})))
        .await;
    assert_eq!(status, 200);
    // B learns the owner once.
    let (status, page) = b.get(&format!("{stream}:events?afterOffset=0")).await;
    assert_eq!(status, 200, "{page}");
    // With the lease row locked, B still forwards at once: it asks the
    // database nothing (asking would wait on the lock and time out).
    let release = hold_lock(
        &b,
        "SELECT 1 FROM stream_leases WHERE path = '/remembered' FOR UPDATE",
    );
    for _ in 0..20 {
        let (status, page) = b.get(&format!("{stream}:events?afterOffset=0")).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["events"].as_array().unwrap().len(), 2, "{page}");
    }
    drop(release);
    // B's actors of the stream went once they answered.
    wait_for("B to hold no actor", Duration::from_secs(10), async || {
        b.metric("streamhost_stream_actors").await == 0
    })
    .await;
}

/// A refold asked for through a host that does not own the instance's
/// stream runs on the owner (its switch fenced by the owner's lease): the
/// instance switches to the new version at its checkpoint.
#[tokio::test]
async fn a_refold_through_another_host_runs_on_the_owner() {
    if on_sqlite() {
        return;
    }
    let a = Server::start_with(Some(CLUSTER), &[]);
    let b = Server::joining(&a, Some(CLUSTER));
    let stream = format!("{P}/refolded");
    let v1 = counter_woken_by(&a, &stream).await;
    for n in 0..3 {
        a.post(&format!("{stream}:append"), ev("x.y/a", json!({"n": n})))
            .await;
    }
    let before = crate::processors::caught_up(&a, &stream, "proc").await;
    assert_eq!(before["digest"], v1["digest"], "{before}");
    // Through B, which owns nothing: the instance is A's.
    let (status, v2) = b
        .deploy_with_query("acme", "proc", guest("effector"), "refold=true")
        .await;
    assert_eq!(status, 200, "{v2}");
    wait_for(
        "the owner to switch the instance to the refolded version",
        Duration::from_secs(30),
        async || {
            let (_, p) = a.get(&format!("{stream}:processors/proc")).await;
            p["digest"] == v2["digest"]
        },
    )
    .await;
    let (_, after) = a.get(&format!("{stream}:processors/proc")).await;
    assert_eq!(
        after["checkpointOffset"], before["checkpointOffset"],
        "{after}"
    );
    assert_ne!(
        after["state"], before["state"],
        "the new version's fold: {after}"
    );
    assert!(
        b.log().contains("refold switched"),
        "B reports the owner's switch:\n{}",
        b.log()
    );
}

/// A host that starts loads only the subscribed streams it owned or nobody
/// holds, not every subscribed stream of the database: streams a live
/// host owns stay there.
#[tokio::test]
async fn a_starting_host_leaves_a_live_hosts_subscribed_streams_alone() {
    if on_sqlite() {
        return;
    }
    let (hook, _posts) = webhook_receiver().await;
    let a = Server::start_with(Some(CLUSTER), &[]);
    for n in 0..3 {
        let stream = format!("{P}/subscribed{n}");
        let sub = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
            "payload": {"subscriptionKey": "h", "receiver": {"action": "webhook-post", "url": hook,
                "delivery": {"start": "beginning", "onFailingEvent": "halt"}}}}]});
        let (status, out) = a.post(&format!("{stream}:append"), sub).await;
        assert_eq!(status, 200, "{out}");
    }
    let b = Server::joining(&a, Some(CLUSTER));
    // Until B has renewed twice (its start-up is long over by then).
    let mut last = cluster_rows(&b, [&b.url]).await.1[0]["lastSeenAt"].clone();
    let mut renewals = 0;
    wait_for("B to renew twice", Duration::from_secs(20), async || {
        let seen = cluster_rows(&b, [&b.url]).await.1[0]["lastSeenAt"].clone();
        if seen != last {
            renewals += 1;
            last = seen;
        }
        renewals >= 2
    })
    .await;
    assert_eq!(
        b.metric("streamhost_stream_loads").await,
        0,
        "B loaded streams A owns"
    );
    let (_, [a_row]) = cluster_rows(&b, [&a.url]).await;
    assert_eq!(a_row["streams"], 3, "{a_row}");
}

#[tokio::test]
async fn a_forwarded_request_has_its_token_checked_before_its_body_is_read() {
    if on_sqlite() {
        return;
    }
    let config = format!(
        "{CLUSTER}{}\n[http]\nbody-timeout-ms = 600000\n",
        crate::support::TOKENS
    );
    let mut a = Server::start_with(Some(&config), &[]);
    a.token = Some("t-acme".into());
    let mut b = Server::joining(&a, Some(&config));
    b.token = Some("t-acme".into());
    // A owns the stream: B forwards requests for it.
    let (status, out) = a
        .post(&format!("{P}/orders:append"), ev("x.y/a", json!({})))
        .await;
    assert_eq!(status, 200, "{out}");
    let host = b.url.trim_start_matches("http://").to_string();
    // The body never comes: an answer at all (before the body timeout)
    // means the token was judged without it.
    for (url, token, status) in [
        (format!("{P}/orders:append"), "wrong", "401"),
        // A URL that names no stream method is refused before its body too.
        (format!("{P}/orders"), "t-acme", "400"),
    ] {
        let mut tcp = crate::isolation::connect(&b);
        let answer = crate::isolation::exchange(
            &mut tcp,
            &format!(
                "POST {url} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\
                 Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n"
            ),
        );
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{url}: {answer}"
        );
    }
}

/// An effect's append to a stream another host owns travels to that host
/// (`/internal/v1/call` carries the append with its authority) and commits
/// there once.
#[tokio::test]
async fn an_effects_append_to_a_stream_another_host_owns_commits_on_its_owner() {
    if on_sqlite() {
        return;
    }
    let a = Server::start_with(Some(CLUSTER), &[]);
    let b = Server::joining(&a, Some(CLUSTER));
    // B owns the target; A owns the processor's stream.
    let notes = format!("{P}/owned-by-b");
    let (status, out) = b
        .post(&format!("{notes}:append"), ev("x.y/opened", json!({})))
        .await;
    assert_eq!(status, 200, "{out}");
    let (status, v) = a.deploy("acme", "effector", guest("effector")).await;
    assert_eq!(status, 200, "{v}");
    let jobs = format!("{P}/jobs-on-a");
    let setup = json!({"events": [
        {"type": "events.iterate.com/stream/subscription-configured",
         "payload": {"subscriptionKey": "fx", "receiver": {"action": "processor-wake",
            "expression": ["components", ["get", "effector"], "wake"]}}},
        {"type": "events.example/effects-requested", "payload": {"effects": [
            {"key": "note-1", "append": {"streamPath": "/owned-by-b",
                "type": "x.y/noted", "payload": {"n": 1}}}]}},
    ]});
    let (status, out) = a.post(&format!("{jobs}:append"), setup).await;
    assert_eq!(status, 200, "{out}");
    wait_for(
        "the effect's append on B's stream",
        Duration::from_secs(30),
        async || {
            let (_, page) = b.get(&format!("{notes}:events?afterOffset=0")).await;
            page["events"]
                .as_array()
                .is_some_and(|e| e.iter().any(|e| e["type"] == "x.y/noted"))
        },
    )
    .await;
    let (_, page) = a.get(&format!("{notes}:events?afterOffset=0")).await;
    let noted = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "x.y/noted")
        .count();
    assert_eq!(noted, 1, "committed once: {page}");
    // It settles after its append commits: wait for that.
    wait_for(
        "the effect to settle",
        Duration::from_secs(30),
        async || {
            let (_, effects) = a.get("/v1/projects/acme/effects?stream=/jobs-on-a").await;
            effects["effects"][0]["status"] == "succeeded"
        },
    )
    .await;
}

/// Parked ingest is in the shared database: an event one host parked is
/// listed, redriven and discarded through another (whose writes go to the
/// stream's owner).
#[tokio::test]
async fn an_event_parked_by_one_host_is_listed_redriven_and_discarded_through_another() {
    if on_sqlite() {
        return;
    }
    let a = Server::start_with(Some(CLUSTER), &[]);
    let b = Server::joining(&a, Some(CLUSTER));
    let users = format!("{P}/users");
    let (status, out) = a.deploy("acme", "welcome", guest("welcome")).await;
    assert_eq!(status, 200, "{out}");
    crate::reactors::welcome_reactor(&a, &users, "welcome.v1").await;
    let refused = crate::reactors::refused_sign_up;
    let (status, out) = a
        .post(
            "/v1/projects/acme/ingest/users",
            json!({"events": [refused("u-1"), refused("u-2")]}),
        )
        .await;
    assert_eq!(status, 202, "{out}");
    let parked = async |host: &Server| {
        host.get("/v1/projects/acme/ingest/parked").await.1["parked"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    wait_for(
        "two parked, seen from B",
        Duration::from_secs(30),
        async || parked(&b).await.len() == 2,
    )
    .await;
    let ids: Vec<i64> = parked(&b)
        .await
        .iter()
        .map(|p| p["id"].as_i64().unwrap())
        .collect();
    crate::reactors::unsubscribe(&b, &users, "welcome.v1").await;
    let (status, out) = b
        .post(
            &format!("/v1/projects/acme/ingest/parked/{}:redrive", ids[0]),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let (status, out) = b
        .post(
            &format!("/v1/projects/acme/ingest/parked/{}:discard", ids[1]),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert!(parked(&a).await.is_empty());
    let events = a.all_events(&users).await;
    let keys: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "user-signed-up")
        .map(|e| e["idempotencyKey"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["u-1"]);
    assert_eq!(
        events
            .iter()
            .filter(|e| e["payload"]["ingest"]["parkedId"] == ids[1])
            .count(),
        1
    );
}

/// The library embedded in a program, as a host of a cluster whose other
/// host (a server) owns the stream: through its typed API alone it reads,
/// appends, deploys and reads the processor the owner runs. Each request
/// goes to the owner (`Host::apply` forwards it and reads back the typed
/// answer); the stream's actor, its lease and the processor stay there.
#[tokio::test]
async fn an_embedded_host_reads_appends_and_deploys_on_streams_another_host_owns() {
    if on_sqlite() {
        return;
    }
    let a = Server::start_with(Some(CLUSTER), &[]);
    let stream = format!("{P}/orders");
    let (status, out) = a
        .post(&format!("{stream}:append"), ev("x.y/a", json!({"n": 1})))
        .await;
    assert_eq!(status, 200, "{out}");
    // B: this process, on A's database, serving the cluster on a port of
    // its own.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let b = streamhost::Host::open(streamhost::Config {
        data_dir: dir.path().to_path_buf(),
        storage: Some(a.postgres_url().expect("A on PostgreSQL").to_string()),
        cluster: streamhost::config::ClusterConfig {
            advertise_url: Some(url.clone()),
            lease_ms: 1500,
            ..Default::default()
        },
        ..Default::default()
    })
    .expect("opening the embedded host");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(b.clone().serve(listener, async {
        let _ = stopped.await;
    }));
    let orders = b.stream("acme", "/orders").unwrap();

    // Reads: the owner's state and events.
    let state = b.state(&orders).await.expect("the state, from the owner");
    assert_eq!(state.max_offset, 2, "{state:?}");
    // An append: committed by the owner, in its order.
    let out = b
        .append(
            &orders,
            [streamhost::EventInput::new("x.y/a").payload(json!({"n": 2}))],
        )
        .await
        .expect("an append, committed by the owner");
    assert_eq!(out.events[0].offset, 3);
    let through_a = a.all_events(&stream).await;
    assert_eq!(offsets(&through_a), [1, 2, 3]);
    let through_b = b.events(&orders, 0, 100).await.expect("the events");
    let ns: Vec<_> = through_b
        .iter()
        .filter(|e| e.event_type == "x.y/a")
        .map(|e| e.payload["n"].clone())
        .collect();
    assert_eq!(ns, [json!(1), json!(2)]);

    // A deploy through B and a wake subscribed through B: the owner folds
    // the stream; B reads the instance as the owner has it.
    let deployed = b
        .deploy(streamhost::Deploy::new("acme", "counter", guest("counter")))
        .await
        .expect("a deploy through B");
    let wake = b
        .subscribe(
            &orders,
            &streamhost::Subscription::wake("counter", "counter").from_beginning(),
        )
        .await
        .expect("a wake subscribed through B");
    let instance = b
        .wait_for_processor(&orders, "counter", wake.offset, Duration::from_secs(20))
        .await
        .expect("the owner's processor, through B");
    assert_eq!(instance.digest.as_deref(), Some(deployed.digest.as_str()));
    assert_eq!(instance.checkpoint_offset, wake.offset);
    let (status, on_a) = a.get(&format!("{stream}:processors/counter")).await;
    assert_eq!(status, 200, "{on_a}");
    assert_eq!(on_a["checkpointOffset"], json!(instance.checkpoint_offset));
    assert_eq!(on_a["state"], instance.state.clone().unwrap(), "{on_a}");

    // The stream stayed A's: B holds none.
    let cluster = b.cluster().await.expect("the cluster view");
    let row = |u: &str| cluster.hosts.iter().find(|h| h.url == u).cloned();
    assert_eq!(row(&a.url).expect("A's row").streams, 1, "{cluster:?}");
    assert_eq!(row(&url).expect("B's row").streams, 0, "{cluster:?}");
    stop.send(()).unwrap();
    serving.await.unwrap().expect("B served until stopped");
}
