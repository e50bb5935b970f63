//! Retention benchmark: `cargo bench -p streamhost --bench retention`.
//!
//! Runs the host in-process on a temp SQLite database (`durability =
//! full`) and reports, in one run:
//! - storage: a stream of `--events N` (default 1,000,000) events, then
//!   `maxEvents` 1,000 on it with nothing else running: how long the
//!   removal took, and the stream's stored bytes, the bytes SQLite's used
//!   pages hold (what a `VACUUM` would keep) and the database files'
//!   bytes, before and after;
//! - append throughput (`--clients C` tasks, default 16, each appending
//!   batches of 100 events to a stream of its own) for `--seconds S`
//!   (default 5) with no retention at work, while retention removes N
//!   events from another stream, and quiet again; the ratio of the
//!   removing window to the quiet ones' mean (aim: ≥ 0.9).

mod common;
use common::arg;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use streamhost::stream::{AppendInput, Authority, Namespace, StreamAddress};
use streamhost::{Config, Host};

/// Events per append.
const BATCH: usize = 100;

fn input(v: Value) -> AppendInput {
    serde_json::from_value(v).expect("append input")
}

fn address(path: &str) -> StreamAddress {
    StreamAddress::new(Namespace::project("bench").unwrap(), path).unwrap()
}

fn batch(n: usize) -> AppendInput {
    let events: Vec<Value> = (0..n)
        .map(|i| json!({"type": "events.example/reading", "payload": {"sensor": "s-17", "celsius": 21.5, "i": i}}))
        .collect();
    input(json!({ "events": events }))
}

/// Bytes of the database files.
fn file_bytes(dir: &Path) -> u64 {
    ["streamhost.db", "streamhost.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// (bytes SQLite's used pages hold, the stream's stored bytes).
fn live_bytes(dir: &Path, path: &str) -> (u64, u64) {
    let db = rusqlite::Connection::open(dir.join("streamhost.db")).unwrap();
    let pages: u64 = db
        .query_row(
            "SELECT (page_count - freelist_count) * page_size FROM pragma_page_count, pragma_freelist_count, pragma_page_size",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let stream: u64 = db
        .query_row("SELECT bytes FROM streams WHERE path = ?1", [path], |r| {
            r.get(0)
        })
        .unwrap_or(0);
    (pages, stream)
}

/// Appends from `clients` tasks until `stop` is set; events appended.
async fn load(host: &Host, clients: usize, stop: Arc<AtomicBool>) -> u64 {
    let appended = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (host, stop, appended) = (host.clone(), stop.clone(), appended.clone());
        tasks.push(tokio::spawn(async move {
            let to = address(&format!("/bench/hot-{c}"));
            while !stop.load(Ordering::Relaxed) {
                host.streams()
                    .append(&to, batch(BATCH), Authority::Public)
                    .await
                    .unwrap();
                appended.fetch_add(BATCH as u64, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    appended.load(Ordering::Relaxed)
}

/// Appends for `seconds`; events/s.
async fn quiet(host: &Host, clients: usize, seconds: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let running = tokio::spawn({
        let (host, stop) = (host.clone(), stop.clone());
        async move { load(&host, clients, stop).await }
    });
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let n = running.await.unwrap();
    n as f64 / started.elapsed().as_secs_f64()
}

/// Appends `events` events to `stream` in batches of 1,000.
async fn fill(host: &Host, stream: &StreamAddress, events: u64) {
    let filled = Instant::now();
    let mut n = 0;
    while n < events {
        let k = 1000.min((events - n) as usize);
        host.streams()
            .append(stream, batch(k), Authority::Public)
            .await
            .unwrap();
        n += k as u64;
    }
    eprintln!(
        "filled {} with {events} events in {:.1} s",
        stream.path,
        filled.elapsed().as_secs_f64()
    );
}

/// Sets `maxEvents` 1,000 on `stream` (holding `events` events) and waits
/// until retention removed the rest; seconds it took.
async fn remove(host: &Host, stream: &StreamAddress, events: u64) -> f64 {
    let started = Instant::now();
    host.configure_retention(stream, None, Some(1000))
        .await
        .unwrap();
    let mut last_report = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        assert!(
            Instant::now() < deadline,
            "retention did not remove {events} events within 30 minutes"
        );
        let state = host.state(stream).await.unwrap();
        if state.first_offset > events - 1000 {
            return started.elapsed().as_secs_f64();
        }
        if last_report.elapsed() >= Duration::from_secs(5) {
            eprintln!(
                "  removing from {}: first offset {} after {:.1} s",
                stream.path,
                state.first_offset,
                started.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() {
    let events = arg("--events", 1_000_000.0) as u64;
    let clients = arg("--clients", 16.0) as usize;
    let seconds = arg("--seconds", 5.0);
    let dir = tempfile::tempdir().unwrap();
    let host = Host::open(Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    })
    .unwrap();

    // Storage: a million events, then retention alone removing them.
    let big = address("/bench/big");
    fill(&host, &big, events).await;
    let files_before = file_bytes(dir.path());
    let (pages_before, stream_before) = live_bytes(dir.path(), "/bench/big");
    let alone = remove(&host, &big, events).await;
    let files_after = file_bytes(dir.path());
    let (pages_after, stream_after) = live_bytes(dir.path(), "/bench/big");
    eprintln!("removed alone in {alone:.1} s");

    // Appends beside it: quiet, while removing another million, quiet.
    let other = address("/bench/other");
    fill(&host, &other, events).await;
    quiet(&host, clients, 1.0).await; // warm-up
    let before = quiet(&host, clients, seconds).await;
    eprintln!("quiet: {before:.0} events/s");
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let running = tokio::spawn({
        let (host, stop) = (host.clone(), stop.clone());
        async move { load(&host, clients, stop).await }
    });
    let window = remove(&host, &other, events).await;
    stop.store(true, Ordering::Relaxed);
    let during = running.await.unwrap() as f64 / started.elapsed().as_secs_f64();
    eprintln!("while removing: {during:.0} events/s");
    let after = quiet(&host, clients, seconds).await;
    eprintln!("quiet again: {after:.0} events/s");
    let quiet_mean = (before + after) / 2.0;
    let removed = events - 1000;

    println!(
        "retention: {removed} events removed from a stream; {clients} clients append batches of {BATCH} to streams of their own\n"
    );
    println!("| window | appends, events/s | ÷ quiet |");
    println!("|---|---|---|");
    println!("| quiet (before) | {before:.0} | |");
    println!(
        "| retention removing {removed} events ({window:.1} s, {:.0} removed/s) | {during:.0} | **{:.3}** |",
        removed as f64 / window,
        during / quiet_mean
    );
    println!("| quiet (after) | {after:.0} | |");
    println!();
    println!(
        "removing {removed} events with no appends beside it: {alone:.1} s ({:.0} removed/s)\n",
        removed as f64 / alone
    );
    let mb = |b: u64| b as f64 / 1e6;
    println!("| storage | before | after |");
    println!("|---|---|---|");
    println!(
        "| the stream's stored bytes | {:.1} MB | {:.3} MB |",
        mb(stream_before),
        mb(stream_after)
    );
    println!(
        "| SQLite's used pages (what a VACUUM keeps) | {:.1} MB | {:.1} MB |",
        mb(pages_before),
        mb(pages_after)
    );
    println!(
        "| database files (db + WAL; SQLite reuses freed pages, a VACUUM returns them) | {:.1} MB | {:.1} MB |",
        mb(files_before),
        mb(files_after)
    );
}
