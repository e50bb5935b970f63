//! Guests in other languages against the Rust one:
//! `cargo bench -p streamhost --bench languages`.
//!
//! The same counter fold in Rust (`examples/processors/counter`),
//! TypeScript (`examples/js`, componentize-js) and Python
//! (`examples/python`, componentize-py), in one run:
//! - the component's size and its compile time (an empty cache);
//! - the wake: load the checkpoint and component, instantiate a fresh
//!   instance, fold one event, commit checkpoint + state (`durability =
//!   normal`), p50 and p99, and its ratio to the Rust wake (aim: ≤ 2);
//! - the first wake after a deploy against a steady one (the deploy already
//!   compiled: aim, no slower than a steady wake by more than noise);
//! - append → checkpoint on a server (`durability = full`, the default):
//!   an append, then the processor's wake through the server's own
//!   delivery until its checkpoint reaches the event (p50, and its ratio to
//!   Rust's: the aim of ≤ 2× is measured here, where an author sees it);
//! - fold throughput in batches of 1000 events (instantiation included);
//! - a deploy into an empty compile cache: how long it takes to answer,
//!   how long the compile goes on behind it, and another project's append
//!   p50 and p99 meanwhile against the same alone;
//! - memory per instance: the linear memory of a fresh instance, and the
//!   most it had while folding a batch of 1000.
//!
//! Needs the guests built: `cargo build --release --target wasm32-wasip2
//! --manifest-path examples/processors/Cargo.toml` and
//! `scripts/build-language-guests`.

mod common;
use common::percentile;

use std::path::Path;
use std::time::Instant;

use serde_json::json;
use streamhost::config::Durability;
use streamhost::processor::runtime::{Batch, Determinism, Runtime, StreamInfo};
use streamhost::processor::wake::{batch_events, wake};
use streamhost::storage::WriteOp;
use streamhost::{Config, Host};

const WAKES: usize = 200;
/// Rounds of append → checkpoint per language (the median is reported).
const SERVED_ROUNDS: usize = 3;

fn language_wasm(path: &str) -> Vec<u8> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read(&file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the guests first: scripts/build-language-guests",
            file.display()
        )
    })
}

fn stream_info(stream_id: &str, max_offset: u64) -> StreamInfo {
    StreamInfo {
        project_id: Some("bench".into()),
        path: "/p".into(),
        stream_id: stream_id.into(),
        stream_created_at: "2026-11-30T00:00:00.000Z".into(),
        max_offset,
    }
}

/// Wake latencies (µs) of component `name`: the first after its deploy,
/// then `WAKES` steady ones, each folding one new event.
async fn wakes(name: &str, bytes: Vec<u8>) -> (f64, Vec<f64>) {
    let dir = tempfile::tempdir().unwrap();
    let host = Host::open(Config {
        data_dir: dir.path().to_path_buf(),
        durability: Durability::Normal,
        ..Config::default()
    })
    .unwrap();
    // The deploy, and its compile in the background (as the server's
    // deploy does); then its first instance, made ahead of the first wake
    // after the compile (given 5 s: a first wake follows a deploy by more).
    let runtime = host.streams().wasm_runtime().clone();
    let digest = streamhost::processor::runtime::digest(&bytes);
    host.deploy(streamhost::Deploy::new("bench", name, bytes))
        .await
        .unwrap();
    runtime.compiled(&digest).await;
    tokio::task::block_in_place(|| {
        runtime.wait_for_instances_made_ahead(std::time::Duration::from_secs(5), |(p, _)| p > 0)
    });
    let storage = host.streams().storage().clone();
    let mut first = f64::NAN;
    let mut steady = Vec::new();
    for i in 0..=WAKES {
        let job = common::next_wake(&host, name, i).await;
        let start = Instant::now();
        tokio::task::block_in_place(|| {
            let woken = wake(job).expect("wake");
            storage
                .commit_blocking(WriteOp::Checkpoint(woken.checkpoint))
                .unwrap();
        });
        let us = start.elapsed().as_secs_f64() * 1e6;
        if i == 0 {
            first = us;
        } else {
            steady.push(us);
        }
    }
    (first, steady)
}

/// Append → checkpoint latencies (µs) of component `name` on a host with
/// the default configuration: the real deploy, a `processor-wake`
/// subscription, then `WAKES` appends of one event, each timed until
/// [`Host::wait_for_processor`] sees the checkpoint at its offset.
async fn served(name: &str, bytes: Vec<u8>) -> Vec<f64> {
    use streamhost::{Deploy, EventInput, Subscription};
    let dir = tempfile::tempdir().unwrap();
    let host = Host::open(Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    })
    .unwrap();
    host.deploy(Deploy::new("bench", name, bytes))
        .await
        .unwrap();
    let stream = host.stream("bench", "/served").unwrap();
    host.subscribe(&stream, &Subscription::wake(name, name).from_beginning())
        .await
        .unwrap();
    let within = std::time::Duration::from_secs(30);
    let mut samples = Vec::new();
    for i in 0..=WAKES {
        let start = Instant::now();
        let appended = host
            .append(&stream, [EventInput::new("x.y/n").payload(json!({"n": i}))])
            .await
            .unwrap();
        let head = appended.events[0].offset;
        host.wait_for_processor(&stream, name, head, within)
            .await
            .unwrap();
        let us = start.elapsed().as_secs_f64() * 1e6;
        // The first is the subscription's first wake (it also folds the
        // configuration event before it): the steady ones are the rest.
        if i > 0 {
            samples.push(us);
        }
    }
    let state = host
        .processor(&stream, name)
        .await
        .unwrap()
        .state
        .unwrap_or_default();
    let sum: usize = (0..=WAKES).sum();
    assert_eq!(state["sum"], sum as u64, "{name}: {state}");
    samples
}

/// Deploys `bytes` to a host with an empty compile cache and, while it
/// compiles in the background, appends one event at a time to another
/// project's stream: answers the deploy's latency (ms), the compile's
/// duration (s), and that project's append p50 and p99 during the compile
/// and alone (µs), alone measured first.
async fn deploy_beside_a_neighbour(name: &str, bytes: Vec<u8>) -> (f64, f64, [f64; 4]) {
    use streamhost::{Deploy, EventInput};
    let dir = tempfile::tempdir().unwrap();
    let host = Host::open(Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    })
    .unwrap();
    let quiet = host.stream("quiet", "/canary").unwrap();
    let append = async |i: usize| {
        let start = Instant::now();
        host.append(&quiet, [EventInput::new("x.y/n").payload(json!({"n": i}))])
            .await
            .unwrap();
        start.elapsed().as_secs_f64() * 1e6
    };
    let mut alone = Vec::new();
    for i in 0..WAKES {
        alone.push(append(i).await);
    }
    let digest = streamhost::processor::runtime::digest(&bytes);
    let runtime = host.streams().wasm_runtime().clone();
    let start = Instant::now();
    host.deploy(Deploy::new("bench", name, bytes))
        .await
        .unwrap();
    let deployed_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut during = Vec::new();
    while runtime.is_compiling(&digest) {
        during.push(append(during.len()).await);
    }
    let compile_s = start.elapsed().as_secs_f64();
    (
        deployed_ms,
        compile_s,
        [
            percentile(during.clone(), 0.5),
            percentile(during, 0.99),
            percentile(alone.clone(), 0.5),
            percentile(alone, 0.99),
        ],
    )
}

/// Events per second of batches of 1000 (median of 10), and the linear
/// memory of an instance: fresh (its `initial-state` call on a runtime that
/// ran nothing else) and at most while folding a batch.
fn throughput(runtime: &Runtime, name: &str, bytes: &[u8]) -> (f64, usize, usize) {
    let digest = streamhost::processor::runtime::digest(bytes);
    let prepared = runtime.prepare(&digest, || Ok(bytes.to_vec())).unwrap();
    let initial = runtime.initial_state(name, &prepared, 20_000).unwrap();
    let fresh = runtime.largest_guest_memory();
    let events: Vec<streamhost::stream::Event> = (0..1000)
        .map(|i| {
            serde_json::from_value(json!({"offset": i as u64 + 2, "type": "x.y/n",
                "payload": {"n": i}, "createdAt": "2026-11-30T00:00:00.000Z"}))
            .unwrap()
        })
        .collect();
    let batch = Batch {
        stream: stream_info("sid", 1001),
        events: batch_events(&events),
        scanned_through_offset: 1001,
    };
    let mut rates = Vec::new();
    for _ in 0..10 {
        let start = Instant::now();
        let folded = runtime
            .fold(
                name,
                &prepared,
                &initial,
                &batch,
                Determinism::default(),
                20_000,
                streamhost::processor::keyed::Bucket::empty().session(),
                None,
            )
            .0
            .unwrap();
        rates.push(1000.0 / start.elapsed().as_secs_f64());
        let state: serde_json::Value = serde_json::from_str(&folded.state).unwrap();
        assert_eq!(state["events"], 1000, "{name}: {state}");
    }
    (
        percentile(rates, 0.5),
        fresh,
        runtime.largest_guest_memory(),
    )
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let guests = [
        ("rust", common::guest_wasm("counter")),
        ("typescript", language_wasm("examples/js/dist/counter.wasm")),
        ("python", language_wasm("examples/python/dist/counter.wasm")),
    ];
    // `-- --served LANGUAGE`: only that language's append → checkpoint,
    // for `perf record` (the wakes run on the server's blocking threads).
    if let Some(only) = common::arg_text("--served") {
        let (_, bytes) = guests
            .into_iter()
            .find(|(l, _)| *l == only)
            .expect("rust, typescript or python");
        let p50 = percentile(rt.block_on(served(&only, bytes)), 0.5);
        println!("{only}: append → checkpoint p50 {:.2} ms", p50 / 1000.0);
        return;
    }
    println!("the counter fold, one component per language:");
    println!(
        "{:<11} {:>9} {:>10} {:>11} {:>11} {:>8} {:>12} {:>14} {:>9} {:>10} {:>14} {:>8}",
        "language",
        "size MiB",
        "compile s",
        "wake p50",
        "wake p99",
        "/ rust",
        "first wake",
        "events/s @1000",
        "mem MiB",
        "@1000 MiB",
        "append→ckpt",
        "/ rust"
    );
    println!(
        "{:>139}",
        format!("(median of {SERVED_ROUNDS} rounds' p50: each round's)")
    );
    let mut rows = Vec::new();
    for (language, bytes) in &guests {
        let size = bytes.len() as f64 / 1048576.0;
        let cache = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(cache.path().to_path_buf()).unwrap();
        let digest = streamhost::processor::runtime::digest(bytes);
        let start = Instant::now();
        runtime.prepare(&digest, || Ok(bytes.clone())).unwrap();
        let compile = start.elapsed().as_secs_f64();
        let (rate, fresh, batch) = throughput(&runtime, language, bytes);
        let (fresh, batch) = (fresh as f64 / 1048576.0, batch as f64 / 1048576.0);
        eprintln!("wakes of the {language} counter ...");
        let (first, steady) = rt.block_on(wakes(language, bytes.clone()));
        rows.push((size, compile, rate, fresh, batch, first, steady));
    }
    // Append → checkpoint, the languages in turn, `SERVED_ROUNDS` times:
    // the median of each language's p50s (rounds interleaved, so that the
    // machine's slower moments fall on every language alike).
    let mut served_p50s = vec![Vec::new(); guests.len()];
    for round in 0..SERVED_ROUNDS {
        for (i, (language, bytes)) in guests.iter().enumerate() {
            eprintln!(
                "appends to a server running the {language} counter (round {}) ...",
                round + 1
            );
            served_p50s[i].push(percentile(
                rt.block_on(served(language, bytes.clone())),
                0.5,
            ));
        }
    }
    let rust_p50 = percentile(rows[0].6.clone(), 0.5);
    let rust_served = percentile(served_p50s[0].clone(), 0.5);
    for (((language, _), row), p50s) in guests.iter().zip(rows).zip(served_p50s) {
        let (size, compile, rate, fresh, batch, first, steady) = row;
        let p50 = percentile(steady.clone(), 0.5);
        let served = percentile(p50s.clone(), 0.5);
        let spread: Vec<String> = p50s.iter().map(|v| format!("{:.2}", v / 1000.0)).collect();
        println!(
            "{language:<11} {size:>9.1} {compile:>10.2} {:>8.2} ms {:>8.2} ms {:>8.2} {:>9.2} ms {rate:>14.0} {fresh:>9.1} {batch:>10.1} {:>11.2} ms {:>8.2}   ({} ms)",
            p50 / 1000.0,
            percentile(steady, 0.99) / 1000.0,
            p50 / rust_p50,
            first / 1000.0,
            served / 1000.0,
            served / rust_served,
            spread.join(", "),
        );
    }
    println!("(aim: append → checkpoint within 2× of Rust's; a first wake after the deploy's compile near a steady one)");
    println!();
    println!("a deploy into an empty compile cache, and another project's appends meanwhile (durability full):");
    println!(
        "{:<11} {:>11} {:>17} {:>22} {:>22} {:>14}",
        "language",
        "deploy ms",
        "compile (bg) s",
        "append p50 alone/during",
        "append p99 alone/during",
        "p99 ratio"
    );
    for (language, file) in [
        ("typescript", "examples/js/dist/counter.wasm"),
        ("python", "examples/python/dist/counter.wasm"),
    ] {
        let (deployed, compile, [p50, p99, alone50, alone99]) =
            rt.block_on(deploy_beside_a_neighbour(language, language_wasm(file)));
        println!(
            "{language:<11} {deployed:>11.0} {compile:>17.2} {:>9.2} / {:>6.2} ms {:>9.2} / {:>6.2} ms {:>14.2}",
            alone50 / 1000.0,
            p50 / 1000.0,
            alone99 / 1000.0,
            p99 / 1000.0,
            p99 / alone99,
        );
    }
}
