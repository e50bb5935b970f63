//! The adversarial suite: one project (`evil`) runs every isolation probe at
//! once against the real binary (hostile JSONata in waits, connections,
//! filters and transforms; webhooks that never answer; floods of live
//! connections, idle sockets,
//! ephemeral events and ingest; bad parameters, platform keys, cross-site
//! requests) while a second project (`good`) appends and reads. The second
//! project's p99 latency stays within 2x of its quiet baseline (a release
//! build; see [`ratio_bound`]), and the server's memory within a stated
//! bound. The
//! figures go to RELIABILITY.md ("Isolation between projects"); against a
//! release build: `STREAMHOST_BIN=$PWD/target/release/streamhost cargo test
//! -p streamhost --test e2e adversarial -- --nocapture`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{wait_for, Server, SseClient};

/// The server's configuration: the defaults, with bounds small enough that
/// the floods reach them in seconds.
const CONFIG: &str = r#"
[limits]
max-live-connections-per-project = 100
max-ephemeral-bytes = 67108864
max-read-bytes = 1048576

[ingest]
max-pending-events = 400

[http]
header-timeout-ms = 1000
max-connections-per-address = 200

[delivery]
max-attempts = 3
backoff-base-ms = 50
backoff-max-ms = 200
"#;

/// How far the second project's median p99 may rise under the probes: 2x
/// against a release build (`STREAMHOST_BIN=$PWD/target/release/streamhost`,
/// the figure RELIABILITY.md records: 1.4x to 2.0x here). The debug binary
/// the normal suite starts spends about ten times the CPU on every request,
/// the probes' included, on the same two cores, while the suite's other
/// tests (headless Chromium among them) run beside it: measured at 2.0x to
/// 2.5x alone and above 3x beside the suite, it is held at 5x. What it
/// guards is the regression this suite exists for: JSONata or a flood on
/// the threads that serve HTTP costs the second project 10x and more.
fn ratio_bound() -> f64 {
    if std::env::var_os("STREAMHOST_BIN").is_some() {
        2.0
    } else {
        5.0
    }
}

/// Slack the normal suite allows above a quiet p99 of a few milliseconds,
/// whatever the ratio: on this kind of machine (a virtual machine of two
/// cores, a 4 ms scheduler tick) one wakeup in a thousand waits about a
/// tick while the cores are busy, even behind `SCHED_IDLE` threads (a 1 ms
/// sleep's p99.9 overshoot: 0.8 ms quiet, 5.0 ms beside eight spinning
/// `SCHED_IDLE` threads), and an append and its read take about five
/// wakeups. So the 10th-slowest of 1,000 operations can hold one or two
/// ticks under any load: beside the spinning calls, quiet p99s of 1.6 and
/// 1.7 ms measured 8.2 and 9.7 ms in two CI runs (ratios 5.1 and 5.6), and
/// 4.8 to 7.1 ms on a machine of the same kind (ratios 2.1 to 4.1). The
/// regressions the suite guards cost tens to hundreds of milliseconds. A release build at full scale (`STREAMHOST_BIN`) allows no
/// slack.
const TICK_SLACK: Duration = Duration::from_millis(15);

/// The p99 allowed beside the probes when the quiet one is `quiet`:
/// [`ratio_bound`] times it, and in the normal suite at least
/// [`TICK_SLACK`] above it.
fn p99_bound(quiet: Duration) -> Duration {
    let ratio = quiet.mul_f64(ratio_bound());
    if std::env::var_os("STREAMHOST_BIN").is_some() {
        ratio
    } else {
        ratio.max(quiet + TICK_SLACK)
    }
}

/// Windows timed under the probes (and as many quiet ones after them, plus
/// the first): the medians of their p99s are compared. Five against a
/// release build (the figure RELIABILITY.md records); three in the normal
/// suite, whose bound is looser (see [`ratio_bound`]).
fn windows() -> usize {
    if std::env::var_os("STREAMHOST_BIN").is_some() {
        5
    } else {
        3
    }
}
/// The server's resident memory stays under this while the probes run.
const RSS_BOUND_BYTES: u64 = 384 * 1024 * 1024;
/// Operations (an append, then a read) the second project times per phase.
const OPERATIONS: usize = 500;
/// Probe rounds (all probes together) before the second project is timed
/// under them, and again after each pause.
const WARM_UP_ROUNDS: u64 = 300;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Times `OPERATIONS` appends and reads of project `good`, one at a time,
/// on a thread and runtime of their own (the probes' tasks do not delay
/// the measurement itself); sorted latencies.
fn time_good_project(url: String) -> Vec<Duration> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let client = reqwest::Client::new();
            let stream = format!("{url}/v1/projects/good/streams/orders");
            let mut out = Vec::with_capacity(2 * OPERATIONS);
            for i in 0..OPERATIONS {
                let started = Instant::now();
                let r = client
                    .post(format!("{stream}:append"))
                    .json(&json!({"events": [{"type": "x.y/order", "payload": {"i": i}}]}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
                let offset = r.json::<Value>().await.unwrap()["events"][0]["offset"]
                    .as_u64()
                    .unwrap();
                out.push(started.elapsed());
                let started = Instant::now();
                let r = client
                    .get(format!(
                        "{stream}:events?afterOffset={}&limit=1",
                        offset - 1
                    ))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 200);
                let page = r.json::<Value>().await.unwrap();
                assert_eq!(page["events"][0]["payload"]["i"], i);
                out.push(started.elapsed());
            }
            out.sort();
            out
        })
    })
    .join()
    .unwrap()
}

/// Pause between two rounds of a probe: the probes reach and hold every
/// bound; a flood of requests as such (rate limiting) is not what they test.
const PACE: Duration = Duration::from_millis(20);

/// Set while the second project's quiet baseline is timed.
static PAUSED: AtomicBool = AtomicBool::new(false);
/// Probe rounds running now.
static ACTIVE: AtomicU64 = AtomicU64::new(0);

/// Runs `probe` again and again until `stop`, [`PACE`] after the previous
/// round ends (not while [`PAUSED`]); counts its rounds.
fn spawn_probe<F, Fut>(stop: &Arc<AtomicBool>, rounds: &Arc<AtomicU64>, probe: F)
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    spawn_probe_every(PACE, stop, rounds, probe);
}

/// [`spawn_probe`], `pace` after the previous round ends.
fn spawn_probe_every<F, Fut>(
    pace: Duration,
    stop: &Arc<AtomicBool>,
    rounds: &Arc<AtomicU64>,
    mut probe: F,
) where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let (stop, rounds) = (Arc::clone(stop), Arc::clone(rounds));
    tokio::spawn(async move {
        let mut pace = tokio::time::interval(pace);
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.load(Ordering::Relaxed) {
            pace.tick().await;
            if PAUSED.load(Ordering::Relaxed) {
                continue;
            }
            ACTIVE.fetch_add(1, Ordering::Relaxed);
            probe().await;
            ACTIVE.fetch_sub(1, Ordering::Relaxed);
            rounds.fetch_add(1, Ordering::Relaxed);
            // The next round a whole pace after this one ends.
            pace.reset();
        }
    });
}

async fn post(client: &reqwest::Client, url: String, body: Value) -> u16 {
    match client.post(url).json(&body).send().await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

/// The probes' client runs at nice 19, as if on another machine: what its
/// own requests cost this machine's two cores is not what the test
/// measures; what the server does for them is (at the server's priority).
#[test]
fn a_hostile_project_leaves_another_projects_latency_and_the_servers_memory_bounded() {
    with_probes_at_nice_19(hostile_project_run());
}

/// Runs `run` on this thread (the measurements it starts keep the normal
/// priority) with a runtime whose worker threads, where the probes' tasks
/// run, are at nice 19.
fn with_probes_at_nice_19(run: impl std::future::Future<Output = ()>) {
    let probes = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(|| {
            // SAFETY: a plain system call on the calling thread (Linux: who = 0).
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, 0, 19);
            }
        })
        .build()
        .unwrap();
    probes.block_on(run);
}

/// The median over `runs` of each run's percentile `p`.
fn median_p(runs: &[Vec<Duration>], p: f64) -> Duration {
    let mut v: Vec<Duration> = runs.iter().map(|r| percentile(r, p)).collect();
    v.sort();
    v[v.len() / 2]
}

/// Milliseconds, two decimals.
fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

async fn hostile_project_run() {
    let s = Server::start_with(Some(CONFIG), &[]);
    let evil = format!("{}/v1/projects/evil/streams", s.url);
    let client = reqwest::Client::new();
    // Evil's streams: one to wait on, one paused (its ingest is held), one
    // with copies whose transform builds a huge value.
    assert_eq!(
        post(
            &client,
            format!("{evil}/src:append"),
            json!({"events": [{"type": "x.y/a"}]})
        )
        .await,
        200
    );
    assert_eq!(
        post(
            &client,
            format!("{evil}/held:append"),
            json!({"events": [{"type": "events.iterate.com/stream/paused"}]})
        )
        .await,
        200
    );
    for i in 0..4 {
        let answer = post(
            &client,
            format!("{evil}/copy{i}:subscribeToEventsFrom"),
            json!({"sourceStreamPath": "/src", "subscriptionKey": format!("bomb{i}"),
                   "jsonataTransform": "{\"payload\": {\"x\": $pad(\"\", 5000000)}}"}),
        )
        .await;
        assert_eq!(answer, 200);
    }

    let quiet = time_good_project(s.url.clone());

    // Webhook subscriptions on the waited-on stream to a receiver that
    // takes each connection and never answers: they hold evil's places of
    // deliveries and sockets, never good's.
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_url = format!("http://{}/hook", hang.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hang.accept().await {
            held.push(socket);
        }
    });
    for i in 0..20 {
        let sub = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
            "payload": {"subscriptionKey": format!("hang{i}"),
                "receiver": {"action": "webhook-post", "url": hang_url,
                    "delivery": {"start": "now", "onFailingEvent": "halt"}}}}]});
        assert_eq!(post(&client, format!("{evil}/src:append"), sub).await, 200);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    // Hostile conditions in waits: a huge range, a huge string, a loop
    // that runs until the time bound on every try.
    for condition in [
        "$count([1..9999999]) > 0",
        "$length($pad('', 300000000)) > 0",
        "($f := function($n) { $f($n + 1) }; $f(0)) > 0",
        "$count([1..100000].($pad('', 1000))) > 0",
    ] {
        let (client, url) = (client.clone(), format!("{evil}/src:waitForEvent"));
        spawn_probe(&stop, &rounds, move || {
            let (client, url) = (client.clone(), url.clone());
            async move {
                post(
                    &client,
                    url,
                    json!({"jsonataCondition": condition, "timeoutMs": 1000}),
                )
                .await;
            }
        });
    }
    // The same conditions on live connections.
    {
        let (client, url) = (
            client.clone(),
            format!("{evil}/src:connect?jsonataCondition=%24count(%5B1..9999999%5D)%20%3E%200"),
        );
        spawn_probe(&stop, &rounds, move || {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let _ = client.get(url).send().await;
            }
        });
    }
    // Events for the copies to halt on and the live connections to filter:
    // a few (the probes test bounds; a project's fan-out to its own live
    // connections is load within them).
    for n in 0..10 {
        post(
            &client,
            format!("{evil}/src:append"),
            json!({"events": [{"type": "x.y/a", "payload": {"n": n}}]}),
        )
        .await;
    }
    // Live connections up to the project's bound (and one more, again and
    // again), held open.
    let held = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    {
        let (held, server_url) = (Arc::clone(&held), s.url.clone());
        spawn_probe(&stop, &rounds, move || {
            let (held, server_url) = (Arc::clone(&held), server_url.clone());
            async move {
                let path = "/v1/projects/evil/streams/src:connect";
                if let Some(Ok(c)) = SseClient::open_at(&server_url, path).await {
                    held.lock().await.push(c);
                }
            }
        });
    }
    // Idle sockets that never send a request head: 150 at a time, from an
    // address of their own (127.0.0.3; the per-address bound is 200).
    {
        let to: std::net::SocketAddr = s.url.trim_start_matches("http://").parse().unwrap();
        spawn_probe(&stop, &rounds, move || async move {
            {
                let mut idle = Vec::new();
                for _ in 0..150 {
                    let socket = tokio::net::TcpSocket::new_v4().unwrap();
                    socket.bind("127.0.0.3:0".parse().unwrap()).unwrap();
                    if let Ok(c) = socket.connect(to).await {
                        idle.push(c);
                    }
                }
                // Held until the server's header timeout closes each.
                for mut c in idle {
                    let mut buf = [0u8; 64];
                    let read = tokio::io::AsyncReadExt::read(&mut c, &mut buf);
                    let closed = tokio::time::timeout(Duration::from_secs(10), read).await;
                    assert!(
                        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
                        "an idle socket was not closed by the header timeout"
                    );
                }
            }
        });
    }
    // Kept-alive connections from one address of its own (127.0.0.2), each
    // serving a `GET /healthz` now and then: 20 more a round, held, past
    // the per-address bound (refused with 429 there).
    {
        let to: std::net::SocketAddr = s.url.trim_start_matches("http://").parse().unwrap();
        let kept = Arc::new(tokio::sync::Mutex::new(Vec::new()));
        spawn_probe(&stop, &rounds, move || {
            let kept = Arc::clone(&kept);
            async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let request = format!("GET /healthz HTTP/1.1\r\nHost: {to}\r\n\r\n");
                let mut kept = kept.lock().await;
                // Those the server closed (its idle timeout) are let go.
                kept.retain(|c: &tokio::net::TcpStream| {
                    let mut byte = [0u8; 1];
                    matches!(c.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                });
                for _ in 0..20 {
                    let socket = tokio::net::TcpSocket::new_v4().unwrap();
                    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
                    let Ok(mut c) = socket.connect(to).await else {
                        continue;
                    };
                    let mut head = [0u8; 12];
                    let served = c.write_all(request.as_bytes()).await.is_ok()
                        && c.read_exact(&mut head).await.is_ok();
                    if served && head.starts_with(b"HTTP/1.1 200") {
                        let mut rest = [0u8; 512];
                        let _ = c.read(&mut rest).await;
                        kept.push(c);
                    } else {
                        assert!(
                            !served || head.starts_with(b"HTTP/1.1 429"),
                            "a connection past the per-address bound: {}",
                            String::from_utf8_lossy(&head)
                        );
                    }
                }
            }
        });
    }
    // Pages of large events (four of 600 KB): each page stops at
    // max-read-bytes. One reader, a page every 200 ms: pages of a megabyte
    // every 20 ms (60 MB/s) are a flood of reads within the bounds, whose
    // CPU is shared (RELIABILITY.md gives its cost), not what this probes.
    {
        let pad = "x".repeat(600_000);
        for n in 0..4 {
            let body = json!({"events": [{"type": "x.y/big", "payload": {"n": n, "pad": pad}}]});
            assert_eq!(post(&client, format!("{evil}/big:append"), body).await, 200);
        }
        {
            let (client, url) = (client.clone(), format!("{evil}/big:events?limit=500"));
            spawn_probe_every(Duration::from_millis(200), &stop, &rounds, move || {
                let (client, url) = (client.clone(), url.clone());
                async move {
                    let page = match client.get(url).send().await {
                        Ok(r) => r.json::<Value>().await.ok(),
                        Err(_) => None,
                    };
                    if let Some(page) = page {
                        let n = page["events"].as_array().map_or(0, Vec::len);
                        assert!(n < 5, "a page of {n} events of 600 KB past a 1 MiB bound");
                    }
                }
            });
        }
    }
    // Ephemeral events of 50 KB into forty streams.
    {
        let (client, base) = (client.clone(), evil.clone());
        let n = Arc::new(AtomicU64::new(0));
        spawn_probe(&stop, &rounds, move || {
            let (client, base, n) = (client.clone(), base.clone(), Arc::clone(&n));
            async move {
                let i = n.fetch_add(1, Ordering::Relaxed) % 40;
                let pad = "x".repeat(50_000);
                post(
                    &client,
                    format!("{base}/typing{i}:append"),
                    json!({"events": [{"type": "x.y/typing", "ephemeral": true, "payload": {"pad": pad}}]}),
                )
                .await;
            }
        });
    }
    // Ingest into the paused stream, past the project's share.
    {
        let (client, url) = (
            client.clone(),
            format!("{}/v1/projects/evil/ingest/held", s.url),
        );
        let n = Arc::new(AtomicU64::new(0));
        spawn_probe(&stop, &rounds, move || {
            let (client, url, n) = (client.clone(), url.clone(), Arc::clone(&n));
            async move {
                let events: Vec<Value> = (0..20)
                    .map(|_| {
                        let k = n.fetch_add(1, Ordering::Relaxed);
                        json!({"type": "x.y/a", "idempotencyKey": format!("k{k}"), "payload": {"pad": "y".repeat(1000)}})
                    })
                    .collect();
                post(&client, url, json!({"events": events})).await;
            }
        });
    }
    // Bad input: offsets past i64, NUL bytes, platform keys, cross-site
    // requests.
    {
        let (client, base) = (client.clone(), evil.clone());
        spawn_probe(&stop, &rounds, move || {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let _ = client
                    .get(format!(
                        "{base}/src:events?afterOffset=18446744073709551615"
                    ))
                    .send()
                    .await;
                post(
                    &client,
                    format!("{base}/src:append"),
                    json!({"events": [{"type": "x.y/a", "idempotencyKey": "a\u{0}b"}]}),
                )
                .await;
                post(&client, format!("{base}/src:append"),
                    json!({"events": [{"type": "x.y/a", "idempotencyKey": "copy:evil:/src:x:0:k:9"}]})).await;
                let _ = client
                    .post(format!("{base}/src:append"))
                    .header("origin", "https://evil.example")
                    .header("content-type", "text/plain")
                    .body(r#"{"events": [{"type": "x.y/a"}]}"#)
                    .send()
                    .await;
            }
        });
    }

    // Memory is sampled every 100 ms while the probes run.
    let mut sample = tokio::time::interval(Duration::from_millis(100));
    let mut rss_max = 0u64;
    let warm = Instant::now() + Duration::from_secs(30);
    while rounds.load(Ordering::Relaxed) < WARM_UP_ROUNDS {
        assert!(Instant::now() < warm, "the probes did not get going");
        sample.tick().await;
        rss_max = rss_max.max(s.rss_bytes());
    }
    // Windows timed under the probes alternate with windows timed while
    // they pause (the live connections and sockets they hold stay): the
    // machine is shared and noisy, so the medians of each are compared.
    let mut quiets = vec![quiet];
    let mut busies = Vec::new();
    for _ in 0..windows() {
        let url = s.url.clone();
        let timing = std::thread::spawn(move || time_good_project(url));
        while !timing.is_finished() {
            sample.tick().await;
            rss_max = rss_max.max(s.rss_bytes());
        }
        busies.push(timing.join().unwrap());
        PAUSED.store(true, Ordering::Relaxed);
        wait_for(
            "the probes' rounds in flight to end",
            Duration::from_secs(30),
            async || ACTIVE.load(Ordering::Relaxed) == 0,
        )
        .await;
        quiets.push(time_good_project(s.url.clone()));
        let before = rounds.load(Ordering::Relaxed);
        PAUSED.store(false, Ordering::Relaxed);
        wait_for(
            "the probes to run again",
            Duration::from_secs(30),
            async || rounds.load(Ordering::Relaxed) >= before + WARM_UP_ROUNDS,
        )
        .await;
    }
    let (q50, q99) = (median_p(&quiets, 0.5), median_p(&quiets, 0.99));
    let (b50, b99) = (median_p(&busies, 0.5), median_p(&busies, 0.99));
    stop.store(true, Ordering::Relaxed);
    // The connections the server still holds: one it closed (its queue
    // overflowed: `delivery-failed`) frees its place for the next, while
    // its client-side handle is still in the list.
    let live = {
        let mut clients = held.lock().await;
        let open = futures_util::future::join_all(
            clients
                .iter_mut()
                .map(|c| c.still_open(Duration::from_millis(300))),
        )
        .await;
        clients.clear();
        open.into_iter().filter(|o| *o).count()
    };

    let p99s = |runs: &[Vec<Duration>]| {
        runs.iter()
            .map(|r| ms(percentile(r, 0.99)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "second project, {} requests per window: quiet p50 {} ms p99 {} ms (windows: {}); \
         under the probes p50 {} ms p99 {} ms (windows: {}); ratio of p99s {:.2}; \
         {} probe rounds; {live} live connections held (bound 100); peak RSS {} MiB",
        quiets[0].len(),
        ms(q50),
        ms(q99),
        p99s(&quiets),
        ms(b50),
        ms(b99),
        p99s(&busies),
        b99.as_secs_f64() / q99.as_secs_f64(),
        rounds.load(Ordering::Relaxed),
        rss_max / (1024 * 1024)
    );
    assert!(
        live <= 100,
        "{live} live connections held past the bound of 100"
    );
    assert!(
        b99 <= p99_bound(q99),
        "the second project's median p99 went from {q99:?} to {b99:?} under the probes \
         (bound: {:?}, {}x or {TICK_SLACK:?} more)",
        p99_bound(q99),
        ratio_bound()
    );
    assert!(
        rss_max <= RSS_BOUND_BYTES,
        "peak RSS {rss_max} bytes, over the {RSS_BOUND_BYTES}-byte bound"
    );
    // The server still answers everyone.
    assert_eq!(s.get("/healthz").await.0, 200);
}

/// Guest code that spins: one project keeps its share of ITX calls (8)
/// running a function that loops until the call's timeout, again and
/// again, on a machine of two cores. The calls run on the Wasm runtime's
/// guest threads, below the priority of requests and commits: the second
/// project's p99 stays within the same bound as under the other probes.
/// (Each call holds one of the project's places; a ninth waits, then gets
/// `429`, as `isolation::` tests.)
///
/// The normal suite runs it on SQLite only: the calls touch no storage,
/// and what they contend for (the cores) is the same on either engine. At
/// full scale (`STREAMHOST_BIN`) it runs on PostgreSQL too.
#[test]
fn a_projects_spinning_guest_calls_leave_another_projects_latency_bounded() {
    if std::env::var_os("STREAMHOST_BIN").is_none()
        && crate::support::skipped_on_postgres(
            "the calls touch no storage; the cores they contend for are the same on either engine",
        )
    {
        return;
    }
    with_probes_at_nice_19(spinning_calls_run());
}

async fn spinning_calls_run() {
    const SPINNERS: usize = 8;
    let config = format!(
        "[processors]\nmax-concurrent-calls-per-project = {SPINNERS}\n\
         [delivery]\ntimeout-ms = 500\n"
    );
    let s = Server::start_with(Some(&config), &[]);
    let (status, out) = s
        .deploy("evil", "kinds", crate::support::guest("kinds"))
        .await;
    assert!(status == 200 || status == 201, "{out}");
    let quiet = time_good_project(s.url.clone());

    let stop = Arc::new(AtomicBool::new(false));
    // While true, the spinners start no call.
    let (paused, _) = tokio::sync::watch::channel(false);
    let spinning = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let statuses = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
    let client = reqwest::Client::new();
    for _ in 0..SPINNERS {
        let (stop, mut paused, spinning, calls, statuses, client) = (
            Arc::clone(&stop),
            paused.subscribe(),
            Arc::clone(&spinning),
            Arc::clone(&calls),
            Arc::clone(&statuses),
            client.clone(),
        );
        let url = format!("{}/v1/projects/evil/itx", s.url);
        tokio::spawn(async move {
            let spin = json!({"expression": ["components", ["get", "kinds"], "spin"], "args": []});
            while !stop.load(Ordering::Relaxed) {
                // Counted before the pause is looked at: a call that
                // starts is always one the pause waits for.
                spinning.fetch_add(1, Ordering::SeqCst);
                if *paused.borrow() {
                    spinning.fetch_sub(1, Ordering::SeqCst);
                    if paused.wait_for(|p| !*p).await.is_err() {
                        return;
                    }
                    continue;
                }
                let status = post(&client, url.clone(), spin.clone()).await;
                spinning.fetch_sub(1, Ordering::SeqCst);
                calls.fetch_add(1, Ordering::Relaxed);
                *statuses.lock().unwrap().entry(status).or_insert(0u64) += 1;
            }
        });
    }
    let spinning_all = async || spinning.load(Ordering::Relaxed) == SPINNERS as u64;
    wait_for("the calls to spin", Duration::from_secs(30), spinning_all).await;

    let mut quiets = vec![quiet];
    let mut busies = Vec::new();
    for _ in 0..windows() {
        busies.push(time_good_project(s.url.clone()));
        paused.send_replace(true);
        wait_for(
            "the spinning calls to end",
            Duration::from_secs(30),
            async || spinning.load(Ordering::Relaxed) == 0,
        )
        .await;
        quiets.push(time_good_project(s.url.clone()));
        paused.send_replace(false);
        wait_for(
            "the calls to spin again",
            Duration::from_secs(30),
            spinning_all,
        )
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    let (q50, q99) = (median_p(&quiets, 0.5), median_p(&quiets, 0.99));
    let (b50, b99) = (median_p(&busies, 0.5), median_p(&busies, 0.99));
    let statuses = statuses.lock().unwrap().clone();
    println!(
        "second project beside {SPINNERS} spinning calls: quiet p50 {} ms p99 {} ms; \
         under the calls p50 {} ms p99 {} ms; ratio of p99s {:.2}; {} calls ended ({statuses:?})",
        ms(q50),
        ms(q99),
        ms(b50),
        ms(b99),
        b99.as_secs_f64() / q99.as_secs_f64(),
        calls.load(Ordering::Relaxed),
    );
    // The calls spun until their timeout: none answered as if it had run.
    assert!(
        !statuses.contains_key(&200),
        "a spinning call answered 200: {statuses:?}"
    );
    assert!(
        b99 <= p99_bound(q99),
        "the second project's median p99 went from {q99:?} to {b99:?} beside the spinning \
         calls (bound: {:?}, {}x or {TICK_SLACK:?} more)",
        p99_bound(q99),
        ratio_bound()
    );
}

/// Effects' latency at one destination (`127.0.0.2`) while the same
/// project's effects to a destination that holds every POST (`127.0.0.1`)
/// and one that answers `429` with `retry-after: 1` (`localhost`) keep
/// the places those destinations may take: the third destination's
/// effects keep their p99 (from the append's answer to the POST's arrival)
/// within 2x of its quiet p99 (the suite's bound against a debug build,
/// [`ratio_bound`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_and_a_throttling_destination_leave_a_third_destinations_effects_on_time() {
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::post;
    use axum::Json;
    const SAMPLES: usize = 40;
    /// Effects to each of the slow and the throttling destination: more
    /// than all the places one project may take (48 of the 64).
    const FLOOD: usize = 100;
    let config = "[delivery]\ntimeout-ms = 15000\nbackoff-base-ms = 10\nbackoff-max-ms = 100\n\
                  [effects]\nmax-attempts = 100\n";
    let s = Server::start_with(Some(config), &[]);
    let serve = |addr: &'static str, app: axum::Router| async move {
        let listener = tokio::net::TcpListener::bind(format!("{addr}:0"))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        port
    };
    // The slow and the throttling receivers count what reaches them; the
    // slow one holds every POST until the test ends (past the measured
    // phase, inside the 15 s timeout), when `held` closes.
    let slow_posts = Arc::new(AtomicU64::new(0));
    let held = Arc::new(tokio::sync::Semaphore::new(0));
    let slow = serve(
        "127.0.0.1",
        axum::Router::new()
            .route(
                "/slow",
                post(
                    |State((n, held)): State<(Arc<AtomicU64>, Arc<tokio::sync::Semaphore>)>| async move {
                        n.fetch_add(1, Ordering::Relaxed);
                        let _ = held.acquire().await;
                        StatusCode::OK
                    },
                ),
            )
            .with_state((slow_posts.clone(), held.clone())),
    )
    .await;
    let throttled_posts = Arc::new(AtomicU64::new(0));
    let throttled = serve(
        "127.0.0.1",
        axum::Router::new()
            .route(
                "/busy",
                post(|State(n): State<Arc<AtomicU64>>| async move {
                    n.fetch_add(1, Ordering::Relaxed);
                    (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")]).into_response()
                }),
            )
            .with_state(throttled_posts.clone()),
    )
    .await;
    let (arrived, mut arrivals) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let quiet = serve(
        "127.0.0.2",
        axum::Router::new()
            .route(
                "/quiet",
                post(
                    |State(tx): State<tokio::sync::mpsc::UnboundedSender<(String, Instant)>>,
                     Json(body): Json<Value>| async move {
                        let key = body["key"].as_str().unwrap_or_default().to_string();
                        let _ = tx.send((key, Instant::now()));
                        StatusCode::OK
                    },
                ),
            )
            .with_state(arrived),
    )
    .await;
    let fx = "/v1/projects/acme/streams/fx";
    crate::effects::effector_on(&s, fx).await;
    // Effects to the third destination one at a time: the time from the
    // append's answer to the POST's arrival, sorted.
    let mut time_quiet = async |phase: &str| -> Vec<Duration> {
        let mut out = Vec::with_capacity(SAMPLES);
        // Spread over four seconds: the throttled effects come due again
        // every second.
        let mut pace = tokio::time::interval(Duration::from_millis(100));
        for i in 0..SAMPLES {
            pace.tick().await;
            let key = format!("{phase}-{i}");
            let effect = json!([{"key": key, "webhook": {
                "url": format!("http://127.0.0.2:{quiet}/quiet"), "body": {"key": key}}}]);
            crate::effects::request(&s, fx, effect).await;
            let answered = Instant::now();
            let at = loop {
                let (got, at) = tokio::time::timeout(Duration::from_secs(60), arrivals.recv())
                    .await
                    .expect("the quiet destination's effect within a minute")
                    .unwrap();
                if got == key {
                    break at;
                }
            };
            out.push(at.saturating_duration_since(answered));
        }
        out.sort();
        out
    };
    let before = time_quiet("quiet").await;
    // The flood: effects to the slow and the throttling destination, more
    // than their places, in one commit before the third's.
    let mut flood: Vec<Value> = (0..FLOOD)
        .map(|i| {
            json!({"key": format!("slow-{i}"), "webhook": {
            "url": format!("http://127.0.0.1:{slow}/slow"), "body": {}}})
        })
        .collect();
    flood.extend((0..FLOOD).map(|i| {
        json!({"key": format!("busy-{i}"), "webhook": {
            "url": format!("http://localhost:{throttled}/busy"), "body": {}}})
    }));
    crate::effects::request(&s, fx, Value::Array(flood)).await;
    wait_for(
        "the slow destination's places taken and the throttling one answering 429",
        Duration::from_secs(30),
        async || {
            slow_posts.load(Ordering::Relaxed) >= 8
                && throttled_posts.load(Ordering::Relaxed) >= FLOOD as u64
        },
    )
    .await;
    let during = time_quiet("flooded").await;
    let (slow_seen, throttled_seen) = (
        slow_posts.load(Ordering::Relaxed),
        throttled_posts.load(Ordering::Relaxed),
    );
    held.close();
    let (p99_before, p99_during) = (percentile(&before, 0.99), percentile(&during, 0.99));
    let ratio = p99_during.as_secs_f64() / p99_before.as_secs_f64();
    eprintln!(
        "a third destination's effects: p50 {} -> {} ms, p99 {} -> {} ms ({ratio:.2}x) \
         beside {slow_seen} POSTs to the slow destination and {throttled_seen} answered 429",
        ms(percentile(&before, 0.5)),
        ms(percentile(&during, 0.5)),
        ms(p99_before),
        ms(p99_during),
    );
    // No more than its places at the slow destination (the first eight
    // were held all along).
    assert!(slow_seen <= 8, "{slow_seen} POSTs to the slow destination");
    assert!(
        p99_during <= p99_bound(p99_before),
        "p99 {} ms under the flood against {} ms quiet ({ratio:.2}x; bound {} ms: {}x or \
         {TICK_SLACK:?} more)",
        ms(p99_during),
        ms(p99_before),
        ms(p99_bound(p99_before)),
        ratio_bound()
    );
}
