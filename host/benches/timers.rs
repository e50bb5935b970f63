//! Timers benchmark: `cargo bench -p streamhost --bench timers`.
//!
//! Runs the host in-process on a temp SQLite database (`durability = full`,
//! default `[effects]`) with the `effector` guest, and reports in one run:
//! - pending timers: `--pending N` (default 1,000,000) delayed append
//!   effects due in a day, created by folds (1,000 per event): how long
//!   creating them took, and what they cost in storage (the database's
//!   bytes) and in memory (the process's resident set);
//! - their cost to unrelated appends: single-event appends to another
//!   stream, p50 and p99, before the timers exist and beside them, and the
//!   ratio (aim: none beyond noise);
//! - fire lag: `--due-rate R` timers a second (default 1,000) for
//!   `--seconds S` (default 5), beside the pending ones, each an append to
//!   `/bench/fired`: the lag from its `notBefore` to its event's commit
//!   (`createdAt`), p50, p99 and max (aim: p99 ≤ 50 ms).
//!
//! Needs the guests built: `cargo build --release --target wasm32-wasip2
//! --manifest-path examples/processors/Cargo.toml`.

mod common;
use common::{arg, percentile};

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use streamhost::stream::{AppendInput, Authority, Namespace, StreamAddress};
use streamhost::{Config, Host};

/// Timers asked for by one event.
const PER_EVENT: usize = 1_000;
/// Unrelated appends per measurement.
const APPENDS: usize = 400;

fn input(v: Value) -> AppendInput {
    serde_json::from_value(v).expect("append input")
}

fn address(path: &str) -> StreamAddress {
    StreamAddress::new(Namespace::project("bench").unwrap(), path).unwrap()
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The process's resident set, bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Appends one event asking for `effects` on the timers' source stream.
async fn ask(host: &Host, effects: Vec<Value>) -> u64 {
    let appended = host
        .streams()
        .append(
            &address("/bench/timers"),
            input(
                json!({"events": [{"type": "events.example/effects-requested",
                "payload": {"effects": effects}}]}),
            ),
            Authority::Public,
        )
        .await
        .unwrap();
    appended.events[0].offset
}

/// Single-event appends to an unrelated stream: latencies in ms.
async fn appends(host: &Host) -> Vec<f64> {
    let other = address("/bench/other");
    let mut out = Vec::with_capacity(APPENDS);
    for i in 0..APPENDS + 20 {
        let start = Instant::now();
        host.streams()
            .append(
                &other,
                input(json!({"events": [{"type": "bench.example/n", "payload": {"i": i}}]})),
                Authority::Public,
            )
            .await
            .unwrap();
        if i >= 20 {
            out.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    out
}

fn timer(key: String, not_before: i64, i: usize) -> Value {
    json!({"key": key, "notBefore": not_before,
        "append": {"streamPath": "/bench/fired", "type": "bench.example/fired",
            "payload": {"i": i, "notBefore": not_before}}})
}

#[tokio::main]
async fn main() {
    let pending = arg("--pending", 1_000_000.0) as usize;
    let rate = arg("--due-rate", 1_000.0) as usize;
    let seconds = arg("--seconds", 5.0);
    let dir = tempfile::tempdir().unwrap();
    let host = Host::open(Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    })
    .unwrap();
    common::deploy(&host, "effector", common::guest_wasm("effector")).await;
    let source = address("/bench/timers");
    host.streams()
        .append(
            &source,
            input(
                json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": "fx",
                    "receiver": {"action": "processor-wake",
                        "expression": ["components", ["get", "effector"], "wake"]}}}]}),
            ),
            Authority::Public,
        )
        .await
        .unwrap();
    appends(&host).await; // warm-up
    let quiet = appends(&host).await;

    // A million timers due in a day.
    let (bytes_before, rss_before) = (dir_bytes(dir.path()), rss_bytes());
    let created = Instant::now();
    let day = now_ms() + 86_400_000;
    let mut last = 0;
    let mut made = 0;
    // Memory after a tenth of them: a cost per timer would grow tenfold
    // from there.
    let mut rss_tenth = 0;
    // The events asking for them, which pass through the caches of recent
    // events (bounded: 64 MiB) as any events do.
    let mut asking_bytes = 0;
    while made < pending {
        let n = PER_EVENT.min(pending - made);
        let effects: Vec<Value> = (made..made + n)
            .map(|i| timer(format!("later-{i}"), day + i as i64, i))
            .collect();
        asking_bytes += effects.iter().map(|e| e.to_string().len()).sum::<usize>();
        last = ask(&host, effects).await;
        made += n;
        if made == pending / 10 {
            host.wait_for_processor(&source, "effector", last, Duration::from_secs(600))
                .await
                .unwrap();
            rss_tenth = rss_bytes();
        }
        if made % 100_000 == 0 {
            eprintln!(
                "  {made} timers asked for ({:.1} s)",
                created.elapsed().as_secs_f64()
            );
        }
    }
    host.wait_for_processor(&source, "effector", last, Duration::from_secs(600))
        .await
        .unwrap();
    let creating = created.elapsed().as_secs_f64();
    let (bytes_after, rss_after) = (dir_bytes(dir.path()), rss_bytes());
    let sqlite_memory = streamhost::storage::Storage::memory_used();
    let beside = appends(&host).await;

    // Timers falling due at `rate` a second, beside the pending ones.
    let due = (rate as f64 * seconds) as usize;
    let first_due = now_ms() + 3_000;
    let mut asked = 0;
    while asked < due {
        let n = PER_EVENT.min(due - asked);
        let effects = (asked..asked + n)
            .map(|i| timer(format!("due-{i}"), first_due + (i * 1000 / rate) as i64, i))
            .collect();
        last = ask(&host, effects).await;
        asked += n;
    }
    host.wait_for_processor(&source, "effector", last, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        now_ms() < first_due,
        "asking for the due timers took longer than their 3 s head start"
    );
    let fired = address("/bench/fired");
    let deadline = Instant::now() + Duration::from_secs_f64(seconds + 60.0);
    let mut lags: Vec<f64> = Vec::with_capacity(due);
    let mut after = 0;
    while lags.len() < due {
        let page = host.events(&fired, after, 500).await.unwrap_or_default();
        if page.is_empty() {
            assert!(Instant::now() < deadline, "the due timers did not all fire");
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        for e in &page {
            after = e.offset;
            let Some(not_before) = e.payload.get("notBefore").and_then(Value::as_i64) else {
                continue;
            };
            let created = chrono::DateTime::parse_from_rfc3339(&e.created_at)
                .unwrap()
                .timestamp_millis();
            lags.push((created - not_before) as f64);
        }
    }
    let early = lags.iter().filter(|l| **l < 0.0).count();

    println!("timers (durability full, SQLite, {} pending):", pending);
    println!(
        "  creating {pending} pending timers: {creating:.1} s ({:.0} a second)",
        pending as f64 / creating
    );
    let mib = |bytes: f64| bytes / 1048576.0;
    println!(
        "  their cost: storage {:.0} MiB ({:.0} bytes a timer); resident memory {:+.1} MiB after \
         a tenth of them, {:+.1} MiB after all (SQLite's page caches: {:.1} MiB; the events \
         that asked for them: {:.0} MiB)",
        mib(bytes_after.saturating_sub(bytes_before) as f64),
        bytes_after.saturating_sub(bytes_before) as f64 / pending.max(1) as f64,
        mib(rss_tenth as f64 - rss_before as f64),
        mib(rss_after as f64 - rss_before as f64),
        mib(sqlite_memory as f64),
        mib(asking_bytes as f64)
    );
    let (q50, q99) = (percentile(quiet.clone(), 0.5), percentile(quiet, 0.99));
    let (b50, b99) = (percentile(beside.clone(), 0.5), percentile(beside, 0.99));
    println!(
        "  unrelated append: p50 {q50:.2} ms, p99 {q99:.2} ms without timers; p50 {b50:.2} ms, \
         p99 {b99:.2} ms beside them: ratio p50 {:.2}, p99 {:.2}",
        b50 / q50,
        b99 / q99
    );
    println!(
        "  fire lag ({due} timers due at {rate}/s beside the pending): p50 {:.1} ms, p99 {:.1} ms, \
         max {:.1} ms (aim: p99 <= 50 ms); fired before their time: {early}",
        percentile(lags.clone(), 0.5),
        percentile(lags.clone(), 0.99),
        lags.iter().cloned().fold(f64::MIN, f64::max)
    );
}
