//! Append throughput benchmark: `cargo bench -p streamhost --bench append`.
//!
//! Runs the host in-process on a loopback port (real HTTP, real SQLite in a
//! temp dir) and reports, in one run: the disk's raw fsync rate, events/s for
//! single-event appends with 1 and 64 clients, and batched appends (100 per
//! call, 16 clients, over 1 and 100 streams), with `durability` full and
//! normal. Each figure is the median of several runs, shown beside its ratio
//! to the fsync rate measured in the same run, since machines are noisy.
//!
//! Batches with idempotency keys are also set against the storage limit:
//! the same rows (the stored bodies, the keys) inserted into the same table
//! and indexes by bare rusqlite, one thread, in transactions of as many
//! events as the server's group commits held, with the same `synchronous`
//! setting, measured in the same run.
//!
//! Single events are also set against two floors measured in the same run:
//! `GET /healthz` through the host's own HTTP stack (its connection loop,
//! router and middleware, no storage), and the same append request sent to
//! hyper alone (the HTTP framework the host serves with: one connection
//! loop per client, the body read, a fixed answer of an append's size), so
//! what the host adds over the framework is measured, not assumed. The
//! floors and single events are measured again with HTTP/1.1 pipelining:
//! each client writes 16 requests at once on its connection, then reads
//! their answers (what the server does without waiting on its clients'
//! round trips).
//!
//! Options (after `--`): `--seconds S` per run (default 2), `--runs N` (3),
//! `--separate-clients`: the clients run in a separate process (this binary
//! again), so the server's cost is measured alone.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use streamhost::config::{Config, Durability};
use streamhost::Host;

struct Options {
    seconds: f64,
    runs: usize,
    /// Only the scenarios whose printed name contains this.
    only: Option<String>,
}

fn options() -> Options {
    Options {
        seconds: common::arg("--seconds", 2.0),
        runs: common::arg("--runs", 3.0) as usize,
        only: common::arg_text("--only"),
    }
}

/// What a scenario's clients call.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Call {
    /// `POST {stream}:append` on the host.
    Append,
    /// `GET /healthz` on the host: its HTTP stack's floor.
    Healthz,
    /// The single-event append request, sent to hyper alone (reads the
    /// body, answers a fixed one): the framework's floor.
    HyperAlone,
}

#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    call: Call,
    clients: usize,
    /// Events in each request's body (the floors count requests).
    events_per_call: usize,
    streams: usize,
    /// Every event carries an idempotency key of its own.
    keys: bool,
    /// Requests each client pipelines on its one connection (HTTP/1.1:
    /// this many written at once, then their answers read); 0: one at a
    /// time.
    pipeline: usize,
}

/// What one run measured.
struct Run {
    /// Events (or requests, for the HTTP floor) per second.
    rate: f64,
    /// Mean events per group-commit transaction.
    events_per_commit: f64,
    /// Mean time of one group-commit transaction, in microseconds.
    commit_us: f64,
    /// For a scenario with keys: the same rows inserted by bare rusqlite
    /// at the same commit cadence, in events per second.
    bare: Option<f64>,
}

const FLOOR: &[Scenario] = &[
    Scenario {
        name: "hyper alone, 1 client",
        call: Call::HyperAlone,
        clients: 1,
        events_per_call: 1,
        streams: 1,
        keys: false,
        pipeline: 0,
    },
    Scenario {
        name: "hyper alone, 64 clients",
        call: Call::HyperAlone,
        clients: 64,
        events_per_call: 1,
        streams: 1,
        keys: false,
        pipeline: 0,
    },
    Scenario {
        name: "hyper alone, 64 clients pipelining 16",
        call: Call::HyperAlone,
        clients: 64,
        events_per_call: 1,
        streams: 1,
        keys: false,
        pipeline: 16,
    },
    Scenario {
        name: "GET /healthz, 1 client",
        call: Call::Healthz,
        clients: 1,
        events_per_call: 0,
        streams: 1,
        keys: false,
        pipeline: 0,
    },
    Scenario {
        name: "GET /healthz, 64 clients",
        call: Call::Healthz,
        clients: 64,
        events_per_call: 0,
        streams: 1,
        keys: false,
        pipeline: 0,
    },
    Scenario {
        name: "GET /healthz, 64 clients pipelining 16",
        call: Call::Healthz,
        clients: 64,
        events_per_call: 0,
        streams: 1,
        keys: false,
        pipeline: 16,
    },
];

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "single event, 1 client",
        call: Call::Append,
        clients: 1,
        events_per_call: 1,
        streams: 1,
        keys: false,
        pipeline: 0,
    },
    Scenario {
        name: "single event, 64 clients, 1 stream",
        call: Call::Append,
        clients: 64,
        events_per_call: 1,
        streams: 1,
        keys: false,
        pipeline: 0,
    },
    Scenario {
        name: "single event, 64 clients pipelining 16, 1 stream",
        call: Call::Append,
        clients: 64,
        events_per_call: 1,
        streams: 1,
        keys: false,
        pipeline: 16,
    },
    Scenario {
        name: "single event with keys, 64 clients, 1 stream",
        call: Call::Append,
        clients: 64,
        events_per_call: 1,
        streams: 1,
        keys: true,
        pipeline: 0,
    },
    Scenario {
        name: "single event, 64 clients, 64 streams",
        call: Call::Append,
        clients: 64,
        events_per_call: 1,
        streams: 64,
        keys: false,
        pipeline: 0,
    },
    Scenario {
        name: "batch of 100, 16 clients, 1 stream",
        call: Call::Append,
        clients: 16,
        events_per_call: 100,
        streams: 1,
        keys: false,
        pipeline: 0,
    },
    Scenario {
        name: "batch of 100, 16 clients, 100 streams",
        call: Call::Append,
        clients: 16,
        events_per_call: 100,
        streams: 100,
        keys: false,
        pipeline: 0,
    },
    Scenario {
        name: "batch of 100 with keys, 16 clients, 1 stream",
        call: Call::Append,
        clients: 16,
        events_per_call: 100,
        streams: 1,
        keys: true,
        pipeline: 0,
    },
    Scenario {
        name: "batch of 100 with keys, 16 clients, 100 streams",
        call: Call::Append,
        clients: 16,
        events_per_call: 100,
        streams: 100,
        keys: true,
        pipeline: 0,
    },
];

/// Mean of a Prometheus histogram in the host's metrics text.
fn histogram_mean(metrics: &str, name: &str) -> f64 {
    let value = |suffix: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}_{suffix} ")))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let count = value("count");
    if count == 0.0 {
        0.0
    } else {
        value("sum") / count
    }
}

/// One run of `scenario`.
async fn run_once(scenario: Scenario, durability: Durability, seconds: f64) -> Run {
    if scenario.call == Call::HyperAlone {
        return Run {
            rate: hyper_alone(scenario, seconds).await,
            events_per_commit: 0.0,
            commit_us: 0.0,
            bare: None,
        };
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Config {
        data_dir: dir.path().to_path_buf(),
        durability,
        ..Config::default()
    };
    let host = Host::open(config).expect("open host");
    let metrics = host.metrics().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(host.clone().serve(listener, async {
        let _ = stop_rx.await;
    }));

    let rate = clients_against(url, scenario, seconds).await;
    let events_per_commit = histogram_mean(&metrics.render(), "streamhost_commit_group_events");
    let commit_us = histogram_mean(&metrics.render(), "streamhost_commit_duration_seconds") * 1e6;
    let bare = if scenario.keys {
        // The stored text of the last event appended, as the rows' body.
        let stream = host.stream("bench", "/s0").unwrap();
        let head = host.state(&stream).await.unwrap().max_offset;
        let page = host
            .apply(
                &stream,
                streamhost::StreamRequest::Events(streamhost::ReadQuery {
                    after_offset: head - 1,
                    limit: 1,
                    include_ephemeral: false,
                }),
            )
            .await
            .unwrap();
        let streamhost::StreamAnswer::Events(page) = page else {
            panic!("a page of events")
        };
        let body = page.events[0].get().to_string();
        let db = dir.path().join("streamhost.db");
        let per_commit = events_per_commit.round().max(1.0) as usize;
        Some(
            tokio::task::spawn_blocking(move || {
                bare_sqlite(&db, scenario, durability, per_commit, &body, seconds)
            })
            .await
            .unwrap(),
        )
    } else {
        None
    };
    let _ = stop_tx.send(());
    let _ = server.await;
    Run {
        rate,
        events_per_commit,
        commit_us,
        bare,
    }
}

/// `scenario`'s clients against the server at `url`, in this process or
/// (`--separate-clients`) in another: events (or requests) per second.
async fn clients_against(url: String, scenario: Scenario, seconds: f64) -> f64 {
    if common::separate_clients() {
        let index = FLOOR
            .iter()
            .chain(SCENARIOS)
            .position(|s| s.name == scenario.name)
            .expect("a listed scenario");
        let args = vec![
            "--url".to_string(),
            url,
            "--scenario".into(),
            index.to_string(),
            "--seconds".into(),
            seconds.to_string(),
        ];
        let line = tokio::task::spawn_blocking(move || common::run_child("append", &args))
            .await
            .unwrap();
        line.trim().parse().expect("the client's events/s")
    } else {
        drive(&url, scenario, seconds).await
    }
}

/// What hyper alone answers: the size and type of a single-event append's
/// answer.
const FIXED_ANSWER: &[u8] = br#"{"events":[{"offset":1,"type":"bench.example/appended","idempotencyKey":null}],"maxOffset":1,"warnings":[]}"#;

/// The framework's floor: a hyper HTTP/1.1 server on this runtime (as the
/// host's connection loop builds it: keep-alive, no delay), each request's
/// body read whole and a fixed answer sent; `scenario`'s clients against
/// it, requests per second.
async fn hyper_alone(scenario: Scenario, seconds: f64) -> f64 {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.expect("accept");
            tcp.set_nodelay(true).expect("no delay");
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |request: hyper::Request<hyper::body::Incoming>| async move {
                        let body = request.into_body().collect().await?.to_bytes();
                        assert!(!body.is_empty(), "the append's body");
                        Ok::<_, hyper::Error>(
                            hyper::Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(bytes::Bytes::from_static(FIXED_ANSWER)))
                                .unwrap(),
                        )
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    let rate = clients_against(url, scenario, seconds).await;
    server.abort();
    rate
}

/// The idempotency key of event `i` of client `c`'s request `n`.
fn client_key(c: u64, n: u64, i: u64) -> String {
    format!("c{c}-{n}-{i}")
}

/// The storage limit of the keyed batches: rows like theirs (`body`, keys
/// of the clients' shape) inserted into the server's own `events` table and indexes
/// in `db` (the server, idle, still has it open), by one thread with a
/// prepared statement, `per_commit` to a transaction, under the same
/// `synchronous` setting, for `seconds`; rows per second. The rows go to a
/// stream id no stream has, so they meet the indexes the server's rows are
/// in without colliding with them.
fn bare_sqlite(
    db: &std::path::Path,
    scenario: Scenario,
    durability: Durability,
    per_commit: usize,
    body: &str,
    seconds: f64,
) -> f64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    let sync = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let mut insert = conn
        .prepare(
            "INSERT INTO events (stream, offset, type, idempotency_key, body) \
             VALUES (-1, ?1, 'bench.example/appended', ?2, ?3)",
        )
        .unwrap();
    // The keys the clients send, requests taken from the clients in turn,
    // as a group commit holds them.
    let (per_call, clients) = (scenario.events_per_call as u64, scenario.clients as u64);
    let key = |row: u64| {
        let (request, i) = (row / per_call, row % per_call);
        client_key(request % clients, request / clients + 1, i)
    };
    let mut rows = 0u64;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        for _ in 0..per_commit {
            insert
                .execute(rusqlite::params![rows + 1, key(rows), body])
                .unwrap();
            rows += 1;
        }
        conn.execute_batch("COMMIT").unwrap();
    }
    rows as f64 / start.elapsed().as_secs_f64()
}

/// Runs `scenario`'s clients against the server at `url`: 300 ms of
/// warm-up, then `seconds` measured; events (or requests) per second.
async fn drive(url: &str, scenario: Scenario, seconds: f64) -> f64 {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .unwrap();
    let events = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..scenario.clients {
        let (client, url, events, measuring, stop) = (
            client.clone(),
            url.to_string(),
            events.clone(),
            measuring.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            if scenario.pipeline > 0 {
                return pipelined(&url, scenario, c, &events, &measuring, &stop).await;
            }
            let body_of = |n: usize| {
                let batch: Vec<_> = (0..scenario.events_per_call)
                    .map(|i| {
                        let mut e = json!({"type": "bench.example/appended", "payload": {"client": c, "i": i, "pad": "0123456789abcdef"}});
                        if scenario.keys {
                            e["idempotencyKey"] = json!(client_key(c as u64, n as u64, i as u64));
                        }
                        e
                    })
                    .collect();
                bytes::Bytes::from(serde_json::to_vec(&json!({ "events": batch })).unwrap())
            };
            let mut body = body_of(0);
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let stream = (c + n * scenario.clients) % scenario.streams;
                n += 1;
                if scenario.keys {
                    body = body_of(n);
                }
                let request = match scenario.call {
                    Call::Healthz => client.get(format!("{url}/healthz")),
                    Call::Append | Call::HyperAlone => client
                        .post(format!("{url}/v1/projects/bench/streams/s{stream}:append"))
                        .header("content-type", "application/json")
                        .body(body.clone()),
                };
                let r = request.send().await.expect("request");
                assert_eq!(r.status(), 200, "request failed");
                let _ = r.bytes().await;
                if measuring.load(Ordering::Relaxed) {
                    let counted = scenario.events_per_call.max(1) as u64;
                    events.fetch_add(counted, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // warm-up
    measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    events.load(Ordering::Relaxed) as f64 / elapsed
}

/// One client of a pipelining scenario, until `stop`: on a connection of
/// its own, `scenario.pipeline` requests written at once (each a single
/// event, or a `GET /healthz`), then their answers read, and again.
async fn pipelined(
    url: &str,
    scenario: Scenario,
    c: usize,
    events: &AtomicU64,
    measuring: &AtomicBool,
    stop: &AtomicBool,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.strip_prefix("http://").expect("an http:// URL");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("no delay");
    let body = serde_json::to_vec(&json!({"events": [{"type": "bench.example/appended",
        "payload": {"client": c, "i": 0, "pad": "0123456789abcdef"}}]}))
    .unwrap();
    let mut answers = Vec::with_capacity(64 * 1024);
    let mut requests = Vec::new();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        requests.clear();
        for _ in 0..scenario.pipeline {
            let stream = (c + n * scenario.clients) % scenario.streams;
            n += 1;
            match scenario.call {
                Call::Healthz => requests.extend_from_slice(
                    format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes(),
                ),
                Call::Append | Call::HyperAlone => {
                    requests.extend_from_slice(
                        format!(
                            "POST /v1/projects/bench/streams/s{stream}:append HTTP/1.1\r\n\
                             host: {addr}\r\ncontent-type: application/json\r\n\
                             content-length: {}\r\n\r\n",
                            body.len()
                        )
                        .as_bytes(),
                    );
                    requests.extend_from_slice(&body);
                }
            }
        }
        tcp.write_all(&requests).await.expect("write the requests");
        let mut answered = 0;
        while answered < scenario.pipeline {
            match complete_answer(&answers) {
                Some(length) => {
                    answers.drain(..length);
                    answered += 1;
                }
                None => {
                    let read = tcp.read_buf(&mut answers).await.expect("read the answers");
                    assert!(read > 0, "the server closed the connection");
                }
            }
        }
        if measuring.load(Ordering::Relaxed) {
            events.fetch_add(scenario.pipeline as u64, Ordering::Relaxed);
        }
    }
}

/// The length of the whole answer at the start of `buf`, once it is all
/// there; an answer other than a `200` with a length fails the run.
fn complete_answer(buf: &[u8]) -> Option<usize> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut answer = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head) = answer.parse(buf).expect("an HTTP answer") else {
        return None;
    };
    assert_eq!(
        answer.code,
        Some(200),
        "request failed: {}",
        String::from_utf8_lossy(buf)
    );
    let length: usize = answer
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
        .expect("an answer with a content-length");
    (buf.len() >= head + length).then_some(head + length)
}

/// The client process of `--separate-clients`: prints the events/s.
fn child() {
    let url = common::arg_text("--url").expect("--url");
    let index = common::arg("--scenario", 0.0) as usize;
    let seconds = common::arg("--seconds", 2.0);
    let scenario = *FLOOR
        .iter()
        .chain(SCENARIOS)
        .nth(index)
        .expect("a scenario");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let rate = rt.block_on(async move {
        tokio::spawn(async move { drive(&url, scenario, seconds).await })
            .await
            .unwrap()
    });
    println!("{rate}");
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

fn main() {
    if common::child_role().is_some() {
        return child();
    }
    let opts = options();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let probe_dir = tempfile::tempdir().unwrap();
    eprintln!("measuring the raw fsync rate ...");
    let fsyncs = median(
        (0..opts.runs)
            .map(|_| common::fsync_rate(probe_dir.path()))
            .collect(),
    );
    println!("raw fsync rate (4 KiB write + fdatasync): {fsyncs:.0}/s  (= the one-fsync-per-append ceiling)");
    if common::separate_clients() {
        println!("clients: in a separate process (the server's cost alone)");
    }
    println!();
    println!(
        "{:<40} {:>8} {:>12} {:>10} {:>14} {:>10}",
        "scenario", "durab.", "events/s", "÷ fsync/s", "events/commit", "commit µs"
    );
    // `--only TEXT`: the scenarios whose name (with its durability, as
    // printed: "single event, 1 client normal") contains TEXT, to profile
    // one path alone.
    let chosen = |name: &str, durability: &str| {
        opts.only
            .as_deref()
            .is_none_or(|only| format!("{name} {durability}").contains(only))
    };
    // The floors' requests/s, by what they call and their clients.
    let mut floors = std::collections::HashMap::new();
    for s in FLOOR.iter().filter(|s| chosen(s.name, "-")) {
        eprintln!("running {} ...", s.name);
        let runs: Vec<Run> = (0..opts.runs)
            .map(|_| rt.block_on(run_once(*s, Durability::Full, opts.seconds)))
            .collect();
        let rate = median(runs.iter().map(|r| r.rate).collect());
        println!(
            "{:<40} {:>8} {:>12.0} {:>10} {:>14}",
            s.name, "-", rate, "(req/s)", "-"
        );
        floors.insert((s.call, s.clients, s.pipeline), rate);
    }
    let mut full = vec![None; SCENARIOS.len()];
    let mut storage_limits = Vec::new();
    // Each scenario's rate, by its name and durability: a scenario with
    // keys is set against the same scenario without.
    let mut rates = std::collections::HashMap::new();
    for durability in [Durability::Full, Durability::Normal] {
        let label = if durability == Durability::Full {
            "full"
        } else {
            "normal"
        };
        for (i, s) in SCENARIOS.iter().enumerate() {
            if !chosen(s.name, label) {
                continue;
            }
            eprintln!("running {} ({durability:?}) ...", s.name);
            let runs: Vec<Run> = (0..opts.runs)
                .map(|_| rt.block_on(run_once(*s, durability, opts.seconds)))
                .collect();
            let rate = median(runs.iter().map(|r| r.rate).collect());
            let per_commit = median(runs.iter().map(|r| r.events_per_commit).collect());
            let commit_us = median(runs.iter().map(|r| r.commit_us).collect());
            if let Some(bare) = runs.iter().map(|r| r.bare).collect::<Option<Vec<f64>>>() {
                // Each run's ratio to its own storage limit, then their median.
                let ratio = median(runs.iter().filter_map(|r| Some(r.rate / r.bare?)).collect());
                storage_limits.push(format!(
                    "{:<40} {:>8} {:>12.0} {:>12.0} {:>8.2}   (aim ≥ 0.8)",
                    s.name,
                    label,
                    rate,
                    median(bare),
                    ratio
                ));
            }
            rates.insert(format!("{} {label}", s.name), rate);
            let vs_full = match (durability, full[i]) {
                (Durability::Normal, Some(f)) => format!("  (normal/full {:.2})", rate / f),
                (Durability::Normal, None) => String::new(),
                _ => {
                    full[i] = Some(rate);
                    String::new()
                }
            };
            println!(
                "{:<40} {:>8} {:>12.0} {:>9.1}× {:>14.1} {:>10.0}{vs_full}",
                s.name,
                label,
                rate,
                rate / fsyncs,
                per_commit,
                commit_us
            );
        }
    }
    let against_floors: Vec<String> = ["full", "normal"]
        .iter()
        .flat_map(|label| SCENARIOS.iter().map(move |s| (s, label)))
        .filter(|(s, _)| s.events_per_call == 1 && !s.keys && s.streams == 1)
        .filter_map(|(s, label)| {
            let rate = rates.get(&format!("{} {label}", s.name))?;
            let floor = |call| {
                floors
                    .get(&(call, s.clients, s.pipeline))
                    .map_or("-".to_string(), |f: &f64| format!("{f:.0} {:.2}", rate / f))
            };
            Some(format!(
                "{:<40} {:>8} {:>12.0} {:>16} {:>16}",
                s.name,
                label,
                rate,
                floor(Call::HyperAlone),
                floor(Call::Healthz)
            ))
        })
        .collect();
    if !floors.is_empty() {
        print_table(
            "single events against the floors, same run (the floor's requests/s, then events/s ÷ it; aim ≥ 0.85 of hyper alone)",
            &format!(
                "{:<40} {:>8} {:>12} {:>16} {:>16}",
                "scenario", "durab.", "events/s", "hyper alone", "GET /healthz"
            ),
            &against_floors,
        );
    }
    print_table(
        "the storage limit: the same rows by bare rusqlite, same commit cadence, same run",
        &format!(
            "{:<40} {:>8} {:>12} {:>12} {:>8}",
            "scenario", "durab.", "events/s", "bare rows/s", "÷ bare"
        ),
        &storage_limits,
    );
    let keyed: Vec<String> = ["full", "normal"]
        .iter()
        .flat_map(|label| SCENARIOS.iter().map(move |s| (s, label)))
        .filter(|(s, _)| s.keys)
        .filter_map(|(s, label)| {
            let with = rates.get(&format!("{} {label}", s.name))?;
            let plain = s.name.replace(" with keys", "");
            let without = rates.get(&format!("{plain} {label}"))?;
            Some(format!(
                "{:<40} {:>8} {:>12.0} {:>12.0} {:>8.2}   (aim ≥ 0.9)",
                s.name,
                label,
                with,
                without,
                with / without
            ))
        })
        .collect();
    print_table(
        "idempotency keys: each event with a key of its own against the same scenario without, same run",
        &format!(
            "{:<40} {:>8} {:>12} {:>12} {:>8}",
            "scenario", "durab.", "events/s", "no keys", "÷"
        ),
        &keyed,
    );
}

/// A table after a blank line: its title, its header and its lines;
/// nothing when it has no lines.
fn print_table(title: &str, header: &str, lines: &[String]) {
    if lines.is_empty() {
        return;
    }
    println!();
    println!("{title}");
    println!("{header}");
    for line in lines {
        println!("{line}");
    }
}
