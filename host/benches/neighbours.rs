//! Neighbours benchmark: `cargo bench -p streamhost --bench neighbours`.
//!
//! How much one project's large appends slow another project's small ones.
//! The host runs in-process on a temp SQLite database (`durability =
//! full`) on a loopback port; each project's clients run on a runtime of
//! their own (as other processes would: a client's work never waits on
//! the host's workers). A quiet project appends one small event every
//! 10 ms and times each append, in three phases of `--seconds`: alone,
//! beside a loud project whose `--writers` clients append `--events` events
//! of `--event-bytes` each in a loop (one append after another, each to a
//! stream of its own), and alone again. Reported, as medians of `--runs`:
//! the quiet project's p50 and p99 in each phase and the ratio of the loud
//! phase to the quiet ones (the lower quiet figure), measured in the same
//! run; and the loud project's MB/s.
//!
//! Options (after `--`): `--seconds S` per phase (default 4), `--runs N`
//! (3), `--writers N` (4), `--events N` per append (7), `--event-bytes N`
//! (1000000). `STREAMHOST_BENCH_POSTGRES=postgres://…` (a server's URL
//! with a database to connect to) runs it on a fresh PostgreSQL database
//! instead of SQLite.

mod common;
use common::{arg, percentile};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use streamhost::{Config, Host};

fn median(xs: Vec<f64>) -> f64 {
    percentile(xs, 0.5)
}

/// The quiet project's appends for `seconds`: their latencies in ms.
async fn quiet(client: &reqwest::Client, url: &str, seconds: f64) -> Vec<f64> {
    let mut latencies = Vec::new();
    let mut pace = tokio::time::interval(Duration::from_millis(10));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut n = 0u64;
    while Instant::now() < end {
        pace.tick().await;
        n += 1;
        let started = Instant::now();
        let r = client
            .post(format!("{url}/v1/projects/quiet/streams/canary:append"))
            .json(&json!({"events": [{"type": "bench.example/tick", "payload": {"n": n}}]}))
            .send()
            .await
            .expect("quiet append");
        assert_eq!(r.status(), 200, "quiet append failed");
        let _ = r.bytes().await;
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
    }
    latencies
}

struct Run {
    /// (p50, p99) in ms: alone, beside the loud project, alone again.
    phases: [(f64, f64); 3],
    loud_mb_s: f64,
}

/// The clients' own runtimes (as other processes would be): a client's
/// work never waits on the host's workers, nor the host's on a client's.
struct Clients {
    quiet: tokio::runtime::Runtime,
    loud: tokio::runtime::Runtime,
}

impl Clients {
    fn new() -> Clients {
        let runtime = |name: &str, threads: usize| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .thread_name(name)
                .enable_all()
                .build()
                .unwrap()
        };
        Clients {
            quiet: runtime("quiet-client", 1),
            loud: runtime("loud-client", 2),
        }
    }

    /// The quiet project's appends for `seconds`, on its client's runtime.
    async fn quiet(&self, url: &str, seconds: f64) -> Vec<f64> {
        let url = url.to_string();
        self.quiet
            .spawn(async move { quiet(&reqwest::Client::new(), &url, seconds).await })
            .await
            .unwrap()
    }
}

/// `postgres`: a PostgreSQL server's URL to run on (a fresh database of
/// it), else SQLite.
async fn run_once(
    clients: &Clients,
    postgres: Option<&str>,
    seconds: f64,
    writers: usize,
    events: usize,
    event_bytes: usize,
) -> Run {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    if let Some(base) = postgres.map(str::to_string) {
        // (The client blocks: off the runtime.)
        config.storage = Some(
            std::thread::spawn(move || {
                common::fresh_postgres(&base, "streamhost_bench_neighbours")
            })
            .join()
            .unwrap(),
        );
    }
    let host = Host::open(config).expect("open host");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(host.serve(listener, async {
        let _ = stop_rx.await;
    }));
    // Warm: the canary stream exists and its first appends are done.
    clients.quiet(&url, 0.3).await;

    let figures = |l: Vec<f64>| (percentile(l.clone(), 0.5), percentile(l, 0.99));
    let before = figures(clients.quiet(&url, seconds).await);

    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let first_written = Arc::new(tokio::sync::Notify::new());
    let pad = "x".repeat(event_bytes.saturating_sub(64));
    let body = bytes::Bytes::from(
        serde_json::to_vec(&json!({
            "events": (0..events)
                .map(|i| json!({"type": "bench.example/large", "payload": {"i": i, "pad": pad}}))
                .collect::<Vec<_>>()
        }))
        .unwrap(),
    );
    let client = reqwest::Client::new();
    let mut loud = Vec::new();
    for w in 0..writers {
        let (client, url, stop, written, first_written, body) = (
            client.clone(),
            url.clone(),
            stop.clone(),
            written.clone(),
            first_written.clone(),
            body.clone(),
        );
        loud.push(clients.loud.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = client
                    .post(format!("{url}/v1/projects/loud/streams/l{w}:append"))
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .expect("loud append");
                assert_eq!(r.status(), 200, "loud append failed");
                let _ = r.bytes().await;
                written.fetch_add(body.len() as u64, Ordering::Relaxed);
                first_written.notify_one();
            }
        }));
    }
    // The loud project's first appends are under way before timing.
    tokio::time::timeout(Duration::from_secs(60), first_written.notified())
        .await
        .expect("the loud project wrote nothing in a minute");
    let (start, at_start) = (Instant::now(), written.load(Ordering::Relaxed));
    let during = figures(clients.quiet(&url, seconds).await);
    let loud_mb_s =
        (written.load(Ordering::Relaxed) - at_start) as f64 / start.elapsed().as_secs_f64() / 1e6;
    stop.store(true, Ordering::Relaxed);
    for t in loud {
        t.await.unwrap();
    }
    let after = figures(clients.quiet(&url, seconds).await);
    let _ = stop_tx.send(());
    let _ = server.await;
    Run {
        phases: [before, during, after],
        loud_mb_s,
    }
}

fn main() {
    let seconds = arg("--seconds", 4.0);
    let runs = arg("--runs", 3.0) as usize;
    let writers = arg("--writers", 4.0) as usize;
    let events = arg("--events", 7.0) as usize;
    let event_bytes = arg("--event-bytes", 1_000_000.0) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let postgres = std::env::var("STREAMHOST_BENCH_POSTGRES").ok();
    let clients = Clients::new();
    let mut all = Vec::new();
    for run in 0..runs {
        eprintln!("run {} of {runs} ...", run + 1);
        all.push(rt.block_on(run_once(
            &clients,
            postgres.as_deref(),
            seconds,
            writers,
            events,
            event_bytes,
        )));
    }
    let at = |phase: usize, p99: bool| {
        median(
            all.iter()
                .map(|r| {
                    if p99 {
                        r.phases[phase].1
                    } else {
                        r.phases[phase].0
                    }
                })
                .collect(),
        )
    };
    let ratio = |p99: bool| {
        median(
            all.iter()
                .map(|r| {
                    let pick = |(p50, p99_): (f64, f64)| if p99 { p99_ } else { p50 };
                    let quiet = pick(r.phases[0]).min(pick(r.phases[2]));
                    pick(r.phases[1]) / quiet
                })
                .collect(),
        )
    };
    println!(
        "A quiet project's appends (one every 10 ms) beside a loud project: {writers} clients \
         appending {events} events of {event_bytes} bytes each (medians of {runs}; {})",
        match postgres {
            Some(_) => "PostgreSQL",
            None => "SQLite",
        }
    );
    println!("{:<36} {:>10} {:>10}", "phase", "p50 ms", "p99 ms");
    for (i, name) in ["alone", "beside the loud project", "alone again"]
        .iter()
        .enumerate()
    {
        println!("{:<36} {:>10.2} {:>10.2}", name, at(i, false), at(i, true));
    }
    println!(
        "{:<36} {:>10.2} {:>10.2}",
        "beside ÷ alone",
        ratio(false),
        ratio(true)
    );
    println!(
        "the loud project wrote {:.1} MB/s",
        median(all.iter().map(|r| r.loud_mb_s).collect())
    );
}
