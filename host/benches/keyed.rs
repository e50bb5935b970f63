//! Keyed processor state: `cargo bench -p streamhost --bench keyed`.
//!
//! Reports, in one run, with the `ledger` example (a balance per account in
//! `wasi:keyvalue`), `durability = normal`:
//! - single-event wake p50 (checkpoint read, instantiate, fold one deposit
//!   to an existing account, commit) with 10, 10,000 and 1,000,000 keys in
//!   the bucket, and the 1M-key wake as a ratio of the 10-key one (aim:
//!   at most 1.5); the 1M-key wake again with a 1 MiB key cache, so every
//!   read goes to storage;
//! - a fold of 100,000 events touching 100,000 distinct accounts, woken in
//!   batches of 1000 with every commit, against the same guest folding the
//!   same batches over a native in-memory map (the bucket a `HashMap` in
//!   the host, no storage), as a throughput ratio (aim: at least 0.5).
//!
//! `STREAMHOST_BENCH_POSTGRES=postgres://…` runs the same on PostgreSQL
//! after SQLite (`--keys-max N` lowers the largest bucket, `--iterations N`
//! the wakes per size).
//!
//! Needs the guests built: `cargo build --release --target wasm32-wasip2
//! --manifest-path examples/processors/Cargo.toml` (scripts/test does it).

mod common;
use common::{arg, percentile};

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use streamhost::config::Durability;
use streamhost::processor::keyed::{Bucket, Memory};
use streamhost::processor::runtime::StreamInfo;
use streamhost::processor::wake::{fold_events, wake, Guest, WakeJob};
use streamhost::storage::WriteOp;
use streamhost::stream::{AppendInput, Authority, Namespace, StreamAddress};
use streamhost::{Config, Host};

/// Accounts opened per `imported` event while the bucket grows.
const IMPORT_BATCH: u64 = 50_000;

struct Bench {
    host: Host,
    _dir: tempfile::TempDir,
    address: StreamAddress,
    row_id: i64,
    stream_id: String,
    head: u64,
}

impl Bench {
    async fn new(postgres: Option<&str>, cache_bytes: u64) -> Bench {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config {
            data_dir: dir.path().to_path_buf(),
            durability: Durability::Normal,
            ..Config::default()
        };
        config.processors.keyed_cache_bytes = cache_bytes;
        if let Some(base) = postgres {
            // (The `postgres` client runs a runtime of its own: not on this
            // runtime's threads.)
            let base = base.to_string();
            config.storage = Some(
                std::thread::spawn(move || common::fresh_postgres(&base, "streamhost_bench_keyed"))
                    .join()
                    .unwrap(),
            );
        }
        let host = Host::open(config).unwrap();
        common::deploy(&host, "ledger", common::guest_wasm("ledger")).await;
        let address = StreamAddress::new(Namespace::project("bench").unwrap(), "/bank").unwrap();
        Bench {
            host,
            _dir: dir,
            address,
            row_id: 0,
            stream_id: String::new(),
            head: 0,
        }
    }

    /// Drops the host off the runtime's threads (the blocking PostgreSQL
    /// client's connections end with a runtime of their own).
    fn close(self) {
        std::thread::spawn(move || drop(self)).join().unwrap();
    }

    async fn append(&mut self, events: Vec<Value>) {
        let input: AppendInput = serde_json::from_value(json!({ "events": events })).unwrap();
        let out = self
            .host
            .streams()
            .append(&self.address, input, Authority::Public)
            .await
            .unwrap();
        self.head = out.events.last().unwrap().offset;
        self.stream_id = out.stream_id.clone();
        if self.row_id == 0 {
            let storage = self.host.streams().storage();
            self.row_id = storage
                .load_stream("bench", "/bank")
                .unwrap()
                .unwrap()
                .row_id;
        }
    }

    /// One wake of up to `limit` events and its commit, as the server runs
    /// them (one blocking section); its duration in µs.
    fn wake(&self, limit: usize) -> f64 {
        self.wake_parts(limit).0
    }

    /// [`Bench::wake`], and the part of it the commit took (µs).
    fn wake_parts(&self, limit: usize) -> (f64, f64) {
        let storage = self.host.streams().storage().clone();
        let job = WakeJob {
            storage: storage.clone(),
            runtime: self.host.streams().wasm_runtime().clone(),
            row_id: self.row_id,
            project: "bench".into(),
            component: "ledger".into(),
            stream: StreamInfo {
                project_id: Some("bench".into()),
                path: "/bank".into(),
                stream_id: self.stream_id.clone(),
                stream_created_at: "2026-12-01T00:00:00.000Z".into(),
                max_offset: self.head,
            },
            head: self.head,
            limit,
            filter: Default::default(),
            timeout_ms: 60_000,
            now_ms: 0,
            pinned: false,
            fence: None,
            gate: Default::default(),
            seen: Default::default(),
        };
        let start = Instant::now();
        let commit = tokio::task::block_in_place(|| {
            let woken = wake(job).expect("wake");
            let commit = Instant::now();
            storage
                .commit_blocking(WriteOp::Checkpoint(woken.checkpoint))
                .unwrap();
            commit.elapsed()
        });
        (
            start.elapsed().as_secs_f64() * 1e6,
            commit.as_secs_f64() * 1e6,
        )
    }

    /// Grows the bucket to `keys` accounts (`acct-0` ..).
    async fn grow(&mut self, keys: u64) {
        let mut from = 0;
        while from < keys {
            let count = IMPORT_BATCH.min(keys - from);
            self.append(vec![json!({"type": "imported",
                "payload": {"from": from, "count": count, "cents": 100}})])
                .await;
            self.wake(1);
            from += count;
        }
    }
}

/// p50 (µs) of single-event wakes that each deposit to a random existing
/// account of a `keys`-key ledger.
async fn wake_p50(postgres: Option<&str>, keys: u64, iterations: usize, cache: u64) -> f64 {
    let mut b = Bench::new(postgres, cache).await;
    b.grow(keys).await;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations + 20 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let account = format!("acct-{}", seed % keys);
        b.append(vec![json!({"type": "deposited",
            "payload": {"account": account, "cents": 1}})])
            .await;
        let us = b.wake(1);
        if i >= 20 {
            samples.push(us);
        }
    }
    let (used, cap) = b.host.streams().storage().key_cache_usage();
    eprintln!("  ({keys} keys: key cache {used} of {cap} bytes)");
    b.close();
    percentile(samples, 0.5)
}

/// Events/s folding `n` deposits to `n` distinct accounts: through wakes
/// and their commits, and through the same guest over an in-memory map.
async fn fold_throughput(postgres: Option<&str>, n: usize) -> (f64, f64, f64) {
    let mut b = Bench::new(postgres, streamhost::storage::KEY_CACHE_BYTES_DEFAULT).await;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let events: Vec<Value> = chunk
            .iter()
            .map(|i| json!({"type": "deposited", "payload": {"account": format!("acct-{i}"), "cents": 5}}))
            .collect();
        b.append(events).await;
    }
    // The component compiled and loaded before the clock starts.
    let storage = b.host.streams().storage().clone();
    let runtime = b.host.streams().wasm_runtime().clone();
    tokio::task::block_in_place(|| {
        streamhost::processor::deployed(&storage, &runtime, "bench", "ledger").unwrap()
    });
    // Through the wakes: storage reads (misses), writes committed per batch.
    let start = Instant::now();
    let mut wakes = 0;
    let mut committing = 0.0;
    loop {
        let storage = b.host.streams().storage();
        let at = storage
            .checkpoint(b.row_id, "ledger")
            .unwrap()
            .map_or(0, |c| c.checkpoint_offset);
        if at >= b.head {
            break;
        }
        committing += b.wake_parts(1000).1;
        wakes += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let stored = n as f64 / elapsed;
    println!(
        "  ({wakes} wakes; their commits {:.0}% of the time)",
        committing / 1e4 / elapsed
    );
    // The same guest, the same batches, a native in-memory map.
    let bytes = common::guest_wasm("ledger");
    let prepared = runtime
        .prepare(&streamhost::processor::runtime::digest(&bytes), || {
            Ok(bytes.clone())
        })
        .unwrap();
    let guest = Guest {
        runtime: &runtime,
        prepared: &prepared,
        component: "ledger",
        timeout_ms: 60_000,
        output: None,
    };
    let stream = StreamInfo {
        project_id: Some("bench".into()),
        path: "/bank".into(),
        stream_id: b.stream_id.clone(),
        stream_created_at: "2026-12-01T00:00:00.000Z".into(),
        max_offset: b.head,
    };
    // The processor's own range fold (what refold and backfill run: the
    // events read and chosen as a wake chooses them), over a bucket in
    // memory, nothing committed.
    let fold = streamhost::processor::backfill::RangeFold {
        guest,
        storage: &storage,
        row_id: b.row_id,
        stream,
        filter: streamhost::processor::wake::consumed(
            Default::default(),
            &runtime.describe("ledger", &prepared, 60_000).unwrap(),
        ),
        narrow: None,
        spill: None,
    };
    let initial = runtime.initial_state("ledger", &prepared, 60_000).unwrap();
    let start = Instant::now();
    let (state, _, _) = fold
        .run(
            initial,
            0,
            b.head,
            Bucket::new(Arc::new(Memory::default())),
            |_, _| Ok(()),
        )
        .unwrap();
    let native = n as f64 / start.elapsed().as_secs_f64();
    // The floor: the fold calls alone, the batches already read and parsed,
    // the map in memory.
    let mut batches = Vec::new();
    let mut after = 0;
    while after < b.head {
        let events: Vec<streamhost::stream::Event> = storage
            .events_after(b.row_id, after, 1000, b.head)
            .unwrap()
            .into_iter()
            .map(|(_, body)| serde_json::from_str(&body).unwrap())
            .collect();
        after = events.last().unwrap().offset;
        batches.push(
            events
                .into_iter()
                .filter(|e| e.event_type == "deposited")
                .collect::<Vec<_>>(),
        );
    }
    let guest = Guest {
        runtime: &runtime,
        prepared: &prepared,
        component: "ledger",
        timeout_ms: 60_000,
        output: None,
    };
    let mut floor_state = runtime.initial_state("ledger", &prepared, 60_000).unwrap();
    let mut bucket = Bucket::new(Arc::new(Memory::default()));
    let start = Instant::now();
    for batch in batches.iter().filter(|b| !b.is_empty()) {
        let through = batch.last().unwrap().offset;
        let (next, _, folded) =
            fold_events(&guest, &fold.stream, &floor_state, batch, through, bucket).unwrap();
        floor_state = next;
        bucket = folded;
    }
    let floor = n as f64 / start.elapsed().as_secs_f64();
    assert_eq!(floor_state, state);
    let stored_state: Value = serde_json::from_str(
        &storage
            .checkpoint(b.row_id, "ledger")
            .unwrap()
            .unwrap()
            .state,
    )
    .unwrap();
    assert_eq!(
        stored_state,
        serde_json::from_str::<Value>(&state).unwrap(),
        "both folds agree"
    );
    drop(fold);
    b.close();
    (stored, native, floor)
}

async fn report(label: &str, postgres: Option<&str>) {
    let iterations = arg("--iterations", 300.0) as usize;
    let keys_max = arg("--keys-max", 1_000_000.0) as u64;
    println!("{label}:");
    if arg("--fold-only", 0.0) == 0.0 {
        wakes(label, postgres, iterations, keys_max).await;
    }
    let n = arg("--fold-events", 100_000.0) as usize;
    eprintln!("{label}: folding {n} events over {n} keys ...");
    let (stored, native, floor) = fold_throughput(postgres, n).await;
    println!(
        "  fold of {n} events touching {n} keys, events/s: through wakes and commits {stored:.0}; \
         the same events read and folded over an in-memory map {native:.0}: {:.2} of it (aim: at least 0.5); \
         the fold calls alone over an in-memory map {floor:.0}: {:.2} of it",
        stored / native,
        stored / floor
    );
}

async fn wakes(label: &str, postgres: Option<&str>, iterations: usize, keys_max: u64) {
    let mut p50s = Vec::new();
    for keys in [10, 10_000, keys_max] {
        eprintln!("{label}: wakes with {keys} keys ...");
        let p50 = wake_p50(
            postgres,
            keys,
            iterations,
            streamhost::storage::KEY_CACHE_BYTES_DEFAULT,
        )
        .await;
        println!("  single-event wake, {keys:>9} keys: p50 {:>8.1} µs", p50);
        p50s.push(p50);
    }
    eprintln!("{label}: wakes with {keys_max} keys, 1 MiB cache ...");
    let cold = wake_p50(postgres, keys_max, iterations, 1 << 20).await;
    println!("  single-event wake, {keys_max:>9} keys, 1 MiB key cache: p50 {cold:>8.1} µs");
    println!(
        "  {keys_max} keys / 10 keys: {:.2}x (aim: at most 1.5); with the 1 MiB cache {:.2}x",
        p50s[2] / p50s[0],
        cold / p50s[0]
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        report("SQLite", None).await;
        if let Ok(url) = std::env::var("STREAMHOST_BENCH_POSTGRES") {
            report("PostgreSQL", Some(&url)).await;
        }
    });
    // The hosts' tasks still hold PostgreSQL clients, which cannot be
    // dropped on the runtime's threads: end here.
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    std::process::exit(0);
}
